"""`tokentop eval`: the evaluation battery of a serving framework, and its comparison.

    tokentop eval --url URL --out DIR [--plan plan.toml] [--quick]
    tokentop eval --print-plan > plan.toml
    tokentop eval compare DIR_A DIR_B [DIR_C …]

Takes the run's option groups an eval uses (the target, open-loop arrivals, how requests
are made, how load is driven: the URL, model, API, tokenizer, workers); the loads, lengths,
durations, SLOs and faults are the plan's (loadgen/eval/plan.py), and those flags are
refused in words. The same --out again resumes a killed eval at its phase.

In a terminal (stdin and stdout both) the eval runs under the console: the running
phase's panels and a phase strip (loadgen.eval.eval_process runs it in a child process);
`q` stops it resumably. --headless, or stdout not a terminal, prints lines instead.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import msgspec

from tui.commands.args import (
    DefaultsFormatter,
    Parser,
    add_console_arguments,
    add_disk_full_argument,
    add_fleet_load_arguments,
    add_judging_arguments,
    add_length_arguments,
    add_load_level_arguments,
    add_machinery_arguments,
    add_mode_argument,
    add_open_loop_arguments,
    add_prompt_arguments,
    add_request_arguments,
    add_resume_arguments,
    add_shaping_arguments,
    add_target_arguments,
    add_trace_arguments,
    fail,
    fleet_from,
    key_value,
    model_params,
    parse_refusing,
    run_config,
    secrets_from,
    whole,
)

PROG = "tokentop eval"
# the run's flags an eval does not take, and why: said in words when given anyway
NOT_FOR_AN_EVAL = {
    "it is set by the plan (--plan)": (
        add_mode_argument, add_load_level_arguments, add_trace_arguments, add_prompt_arguments,
        add_length_arguments, add_judging_arguments),
    "an eval is always recorded, and the same --out resumes it": (add_resume_arguments,),
    "it is the console's": (add_console_arguments,),
}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        from tui.commands.eval_compare import compare_main

        return compare_main(argv[1:])
    # --out is required, but --print-plan writes nothing there
    p = eval_parser(out_required="--print-plan" not in argv)
    args = parse_refusing(p, argv, "an eval", NOT_FOR_AN_EVAL)
    if args.print_plan:
        from loadgen.eval.plan import DEFAULT_PLAN

        sys.stdout.write(DEFAULT_PLAN)
        return 0
    if not args.out:
        fail("--out DIR is required: where the eval is written (the same DIR again resumes "
             "it)", prog=PROG)
    return _eval(args)


def eval_parser(*, out_required: bool = True) -> argparse.ArgumentParser:
    """The run's groups an eval uses (the target, open-loop arrivals, how requests are
    made, how load is driven) and its own; the loads, lengths, durations and SLOs are the
    plan's."""
    p = Parser(prog=PROG, formatter_class=DefaultsFormatter,
               description="Run the evaluation battery (baseline, pressure ramp, long tail, "
               "faults, leaks, efficiency, scaling) and write one matrix; `tokentop eval "
               "compare A B …` sets evals side by side.")
    add_target_arguments(p)
    load = p.add_argument_group("load (the loads, lengths and durations: the plan's)")
    add_open_loop_arguments(load)
    requests = p.add_argument_group("requests (also the plan's [request] table; a flag "
                                    "given wins)")
    add_request_arguments(requests)
    add_shaping_arguments(requests)
    add_machinery_arguments(p.add_argument_group("measurement"))
    r = p.add_argument_group("recording")
    r.add_argument("--out", metavar="DIR", required=out_required,
                   help="required: the eval's directory (eval.md, eval.json, runs/, PNGs); the "
                   "same directory again resumes an eval that was stopped")
    add_disk_full_argument(r)
    g = p.add_argument_group("eval")
    g.add_argument("--plan", type=Path, help="the plan (TOML); default: the built-in one "
                   "(--print-plan writes it, commented, to start from)")
    g.add_argument("--quick", action="store_true",
                   help="the plan's quick profile: minutes, not a day (the phases shortened)")
    g.add_argument("--print-plan", action="store_true", help="write the default plan and exit")
    g.add_argument("--dcgm-url", metavar="URL",
                   help="a dcgm-exporter's /metrics (e.g. http://127.0.0.1:9400/metrics): SM, "
                   "tensor-pipe and DRAM activity and DCGM's energy in the efficiency rows")
    g.add_argument("--model-params", type=model_params, default=None, metavar="N",
                   help="the model's parameters (8B, 1.5B, 350M, 7e9), for GPU memory per "
                   "billion parameters where the server does not state them (llama.cpp "
                   "does: its figure wins)")
    g.add_argument("--repeat", type=whole(1), default=None, metavar="N",
                   help="run the baseline and each ramp step N times: rows show the mean and "
                   "a 95 %% interval, and compare judges by it (default: the plan's repeat)")
    g.add_argument("--label", metavar="TEXT",
                   help="a name for this eval in its header and in compare (e.g. vllm-0.11-tp2)")
    g.add_argument("--meta", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="a fact for the header, as many as needed (e.g. --meta tp=2 "
                   "--meta commit=abc123)")
    g.add_argument("--headless", action="store_true",
                   help="lines of text only, no console (also when stdout is not a terminal)")
    g.add_argument("--chaos-restart-cmd", metavar="CMD",
                   help="opt-in: during the faults phase kill the server process and run CMD "
                   "(a shell command) to restart it; MTTR from the kill to the first success")
    g.add_argument("--neighbor-cmd", metavar="CMD",
                   help="the interference phase's own neighbour: CMD (a shell command, e.g. a "
                   "training job on another GPU) runs beside the baseline load, in its own "
                   "process group, killed with it at the end (wins over the plan's command; "
                   "not recorded)")
    add_fleet_load_arguments(p)
    return p


def _eval(args: argparse.Namespace) -> int:
    from loadgen.eval.phase_run import EvalError
    from loadgen.worker import eventloop

    ev, resume = built_eval(args)
    if not args.headless and in_a_terminal():
        return _console(ev, resume=resume)
    return eventloop.run(lambda: _run(ev, EvalError))


def built_eval(args: argparse.Namespace):
    """The Eval the command line describes, and whether it resumes one in --out; a plan or
    an eval.json that cannot be used fails here, in words, before anything starts."""
    from loadgen.eval.battery import load_state, resumed
    from loadgen.eval.phase_run import Eval, EvalError
    from loadgen.eval.plan import PlanError, default_plan, read_plan

    out = Path(args.out)
    fleet, password = fleet_from(args, PROG)
    cfg, secrets = run_config(args), secrets_from(args, mqtt_password=password)
    kw = {"secrets": secrets, "chaos_restart_cmd": args.chaos_restart_cmd,
          "dcgm_url": args.dcgm_url, "label": args.label, "meta": dict(args.meta),
          "model_params": args.model_params, "neighbor_cmd": args.neighbor_cmd,
          "fleet": fleet}
    try:
        state = load_state(out)
        if state is not None:
            if args.plan is not None or args.repeat is not None:
                given = "--plan" if args.plan is not None else "--repeat"
                fail(f"{out} holds an eval already, with its own plan: run it again without "
                     f"{given} to resume it, or give another --out", prog=PROG)
            ev = resumed(state, cfg, out, _say, **kw)
            _say(f"eval: resuming {out} ({len(ev.results.ran())} phase(s) done)")
        else:
            plan = read_plan(args.plan) if args.plan else default_plan()
            if args.repeat is not None:
                plan = msgspec.structs.replace(plan, repeat=args.repeat)
            ev = Eval(cfg=cfg, plan=plan, quick=args.quick, out=out, say=_say, **kw)
    except (EvalError, PlanError) as e:
        fail(str(e), prog=PROG)
    ev.cfg = with_plan_request(ev.cfg, ev.plan.request)
    return ev, state is not None


def with_plan_request(cfg, request):
    """`cfg` with the plan's [request] keys where no flag gave them (a flag given wins; the
    extra bodies merge, the flag's keys over the plan's); checked as a run checks them."""
    from loadgen.run.config import ConfigError, body_fields

    values = {name: value for name, value in request.run_fields().items()
              if value is not None and getattr(cfg, name) is None}
    if request.extra_body and cfg.extra_body:
        values["extra_body"] = {**request.extra_body, **cfg.extra_body}
    shaped = msgspec.structs.replace(cfg, **values)
    try:
        body_fields(shaped)
    except ConfigError as e:
        fail(f"{e} (the plan's [request] counts too)", prog=PROG)
    return shaped


def in_a_terminal() -> bool:
    """The console needs a terminal to read keys from and draw on; else today's lines."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _console(ev, *, resume: bool) -> int:
    """The eval in a child process under the console; after it, what a headless eval ends
    with: the matrix and the files written, or the line that resumes it."""
    from loadgen.eval.eval_process import EvalProcess
    from tui.app import TokentopApp

    source = EvalProcess(eval_start(ev, resume=resume))
    app = TokentopApp(source)
    app.run()
    return after_console(source, app.error)


def eval_start(ev, *, resume: bool):
    """What the eval's child process is told to run: this Eval (its Secrets on the pipe)."""
    from loadgen.eval.eval_process import EvalStart
    from loadgen.eval.plan import plan_to_builtins

    return EvalStart(config=ev.cfg, secrets=ev.secrets, out=str(ev.out),
                     plan=plan_to_builtins(ev.plan), quick=ev.quick, resume=resume,
                     label=ev.label, meta=dict(ev.meta), dcgm_url=ev.dcgm_url,
                     chaos_restart_cmd=ev.chaos_restart_cmd, model_params=ev.model_params,
                     neighbor_cmd=ev.neighbor_cmd, fleet=ev.fleet)


def after_console(source, error: str | None) -> int:
    """The alternate screen is gone with the console: the eval's end stays in the terminal
    (the matrix on stdout as a headless eval prints it, the rest on stderr)."""
    outcome = source.eval_outcome()
    if outcome is None:  # it never started: why, in the console's words
        _say(f"{PROG}: {error or 'the eval did not start'}")
        return 2
    if outcome.table:
        print(outcome.table, flush=True)
    for path in outcome.written:
        print(f"wrote {path}", flush=True)
    if outcome.state != "finished":
        _say(outcome.message)
    _say(f"eval: its lines are in {source.log_path}")
    return outcome.code


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _run(ev, eval_error: type[Exception]) -> int:
    from loadgen.eval.battery import run_eval
    from loadgen.eval.eval_process import stopped_line
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
        _say(stopped_line(ev.out, ev.cfg.url))
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
