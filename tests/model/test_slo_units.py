"""`--slo` times need a unit: a bare number is refused, never guessed."""

from __future__ import annotations

import pytest
from support import tokentop

from loadgen.model.slo import SloError, parse_slos


@pytest.mark.parametrize("text", ["ttft<20", "ttft_p99<1.5", "e2e<=3", "tpot<50,ttft<1s"])
def test_a_bare_number_is_refused_and_the_message_names_the_units(text):
    with pytest.raises(SloError, match=r"has no unit: write .*ms or .*s \(units: ms, s, us\)"):
        parse_slos(text)


def test_each_unit_means_what_it_says():
    slos = parse_slos("ttft<20ms,tpot<800us,e2e<2s,itl_p99<1.5s")
    assert slos.per_request is not None
    assert slos.per_request.ttft_us == 20_000
    assert slos.per_request.tpot_us == 800
    assert slos.per_request.e2e_us == 2_000_000
    assert slos.thresholds[0].value == 1_500_000


def test_rates_and_fractions_stay_unitless():
    slos = parse_slos("error_rate<1%,req_s>5,output_tok_s>=100")
    assert [t.value for t in slos.thresholds] == [0.01, 5.0, 100.0]


def test_the_command_line_says_so_in_one_line_with_exit_2():
    proc = tokentop("run", "--headless", "--slo", "ttft<20", "--duration", "1", "--no-record")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tokentop: time '20' has no unit: write 20ms or 20s (units: ms, s, us)"]
