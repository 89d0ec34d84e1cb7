"""Drive load at an OpenAI-compatible server and measure it.

The packages, in dependency order, and what each may import (README, "How it is
built"; the rule is tests/test_layout.py):

    model/     the shared vocabulary (imports nothing of ours): snapshot, kinds, notice,
               source (SnapshotSource, its status, a run's outcome), units (every parser
               and formatter of figures), slo, outage, windows, trend, energy, knee (the one
               knee rule), client_lag, text (the one sanitiser of outside text), hdr, urls
    worker/    the hot path, inside the load worker processes (model only): main, load,
               envelope (one request, both clients), client + http_stream, openai_client,
               sse, stream_measure, interval, workload, distributions, conversation,
               dataset, trace, tokenizer, limits, wire, eventloop
    record/    run directories (model only): rundir, recorder, hlog, replay
    fleet/     MQTT (model only): link, publisher, monitor, merged, remote
    sim/       the simulator, a program of its own (nothing of ours): server, request,
               chunks, exact, words, dialects, metrics, model, prefix_cache, faults, gpu,
               presets, launch, program
    run/       one run, from RunConfig to exit code (model, worker, record, fleet, sim,
               probes): session, coordinator, steering, pool, config, secrets, preflight,
               embedded_sim, resume, ramp, auto_ramp, watch, sinks, summary, headless,
               run_process, child (a child process on a JSON-lines pipe), heap
    analysis/  what runs leave behind (run and below): soak, soak_result, outage_views,
               report, compare, sweep, calibrate
    eval/      the evaluation battery (analysis and below): phases, plan, battery, results,
               matrix, repeats, validity, efficiency, under_fault, header, document,
               compare, proxy, chaos, dcgm_watch, output, eval_process
"""

__version__ = "0.1.0"
