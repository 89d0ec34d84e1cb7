"""`tokentop eval`: the evaluation battery of a serving framework, and its comparison.

    tokentop eval --url URL --out DIR [--plan plan.toml] [--quick]
    tokentop eval --print-plan > plan.toml
    tokentop eval compare DIR_A DIR_B [DIR_C …]

Takes the run's target and workload options (the URL, model, API, tokenizer, workers);
the loads, lengths, durations, SLOs and faults are the plan's (loadgen/eval/plan.py). The
same --out again resumes a killed eval at its phase.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from tui.commands.args import Parser, fail, run_config, secrets_from
from tui.commands.console import console_parser
from tui.commands.sweep import CONSOLE_ONLY, SET_BY_STEPS, DefaultsFormatter

PROG = "tokentop eval"
# the run options the plan sets (each phase's load, lengths, length of run, SLOs)
SET_BY_PLAN = (*SET_BY_STEPS, "mode", "warmup", "dataset", "prompts_file", "input_tokens",
               "output_tokens", "slo", "turns", "think_time", "trace", "trace_speed", "resume",
               "record")
NOT_FOR_AN_EVAL = CONSOLE_ONLY + SET_BY_PLAN


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return compare_main(argv[1:])
    p = eval_parser()
    args = p.parse_args(argv)
    if args.print_plan:
        from loadgen.eval.plan import DEFAULT_PLAN

        sys.stdout.write(DEFAULT_PLAN)
        return 0
    _refuse_unused(p, args)
    if not args.out:
        fail("--out DIR is required: where the eval is written (the same DIR again resumes "
             "it)", prog=PROG)
    return _eval(args)


def eval_parser() -> argparse.ArgumentParser:
    p = console_parser(PROG)
    p.description = ("Run the evaluation battery (baseline, pressure ramp, long tail, faults, "
                     "leaks, efficiency, scaling) and write one matrix; `tokentop eval compare "
                     "A B …` sets evals side by side.")
    p.formatter_class = DefaultsFormatter
    for action in p._actions:
        if action.dest in NOT_FOR_AN_EVAL:
            action.help = argparse.SUPPRESS
        if action.dest == "out":
            action.help = "the eval's directory (eval.md, eval.json, runs/, PNGs); the same " \
                          "directory again resumes an eval that was stopped"
    g = p.add_argument_group("eval")
    g.add_argument("--plan", type=Path, help="the plan (TOML); default: the built-in one "
                   "(--print-plan writes it, commented, to start from)")
    g.add_argument("--quick", action="store_true",
                   help="the plan's quick profile: minutes, not a day (the phases shortened)")
    g.add_argument("--print-plan", action="store_true", help="write the default plan and exit")
    g.add_argument("--dcgm-url", metavar="URL",
                   help="a dcgm-exporter's /metrics (e.g. http://127.0.0.1:9400/metrics): SM, "
                   "tensor-pipe and DRAM activity and DCGM's energy in the efficiency rows")
    g.add_argument("--chaos-restart-cmd", metavar="CMD",
                   help="opt-in: during the faults phase kill the server process and run CMD "
                   "(a shell command) to restart it; MTTR from the kill to the first success")
    return p


def _refuse_unused(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for action in p._actions:
        if action.dest in NOT_FOR_AN_EVAL and getattr(args, action.dest, None) != action.default:
            why = "the console's" if action.dest in CONSOLE_ONLY else "set by the plan (--plan)"
            fail(f"{action.option_strings[-1]} is not for an eval: it is {why}", prog=PROG)


def _eval(args: argparse.Namespace) -> int:
    from loadgen.eval.battery import Eval, EvalError, load_state, resumed
    from loadgen.eval.plan import PlanError, default_plan, read_plan
    from loadgen.worker import eventloop

    out = Path(args.out)
    cfg, secrets = run_config(args), secrets_from(args)
    kw = {"secrets": secrets, "chaos_restart_cmd": args.chaos_restart_cmd,
          "dcgm_url": args.dcgm_url}
    try:
        state = load_state(out)
        if state is not None:
            if args.plan is not None:
                fail(f"{out} holds an eval already: run it again without --plan to resume "
                     "it, or give another --out", prog=PROG)
            ev = resumed(state, cfg, out, _say, **kw)
            _say(f"eval: resuming {out} ({len(ev.results)} phase(s) done)")
        else:
            plan = read_plan(args.plan) if args.plan else default_plan()
            ev = Eval(cfg=cfg, plan=plan, quick=args.quick, out=out, say=_say, **kw)
    except (EvalError, PlanError) as e:
        fail(str(e), prog=PROG)
    return eventloop.run(lambda: _run(ev, EvalError))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _run(ev, eval_error: type[Exception]) -> int:
    from loadgen.eval.battery import run_eval
    from loadgen.eval.output import write_outputs

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    stopped = []

    def stop() -> None:  # the phase under way is not kept: resuming runs it again
        stopped.append(True)
        _say("eval: stopping; the same --out resumes at the phase under way")
        if task is not None:
            task.cancel()

    loop.add_signal_handler(signal.SIGINT, stop)
    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        await run_eval(ev)
    except asyncio.CancelledError:
        if not stopped:
            raise
        _say(f"eval: stopped; resume with: tokentop eval --out {ev.out}")
        return 130
    except eval_error as e:
        _say(f"{PROG}: {e}")
        return 2
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
    table, written = write_outputs(ev)
    print(table, flush=True)
    for path in written:
        print(f"wrote {path}", flush=True)
    return 0


def compare_main(argv: list[str]) -> int:
    from loadgen.eval.matrix import compare, read_eval

    p = Parser(prog=f"{PROG} compare",
               description="Evals side by side, per row, with the change in per cent against "
               "the first and which is better; says where the workloads differ.")
    p.add_argument("evals", nargs="+", type=Path, help="`tokentop eval --out` directories")
    args = p.parse_args(argv)
    if len(args.evals) < 2:
        fail("give two eval directories or more", prog=f"{PROG} compare")
    try:
        evals = [(str(d), read_eval(d)) for d in args.evals]
    except ValueError as e:
        fail(str(e), prog=f"{PROG} compare")
    print(compare(evals))
    return 0
