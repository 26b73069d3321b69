"""``ftkit train``: run the RL training job, then print the forensics verdict over its log.

Values come from ``TrainConfig`` defaults, then ``--config FILE`` (JSON, or TOML by the
``.toml`` suffix), then the options given on the command line. ``--print-config`` prints
the resulting config as JSON and exits. Live progress (one line per optimizer step) goes to
stderr; the final report (run summary, analyzer verdict and findings) is the command's data
on stdout in ``--format human|json|github``. Exit 0 when the analyzer finds nothing at or
above ``--fail-on``, 1 when it does or when the run could not go on (``RunFailed``: too few
live cells, retries exhausted), 2 for a bad config, run directory or layout, 130 / 143 / 129 when
SIGINT / SIGTERM / SIGHUP stopped it (``RunInterrupted``; docs/faults.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ftkit.commands.config_file import read_config_file
from ftkit.commands.options import FailOnOpt, FormatOpt, JunitOpt, report_path
from ftkit.commands.train_options import (
    PANEL_CKPT,
    PANEL_DATA,
    PANEL_DUMPS,
    PANEL_FAULTS,
    PANEL_RL,
    PANEL_SAMPLING,
    Aggregation,
    BestMetric,
    Device,
    DumpCells,
    EngineKind,
    EnginePlacement,
    Loss,
    Precision,
    Reduce,
    given_values,
    opt,
)
from ftkit.findings import FailOn
from ftkit.report.sink import Format, Output

if TYPE_CHECKING:
    from ftkit.train.config import TrainConfig


def _resume_config(
    run_dir: Path, values: dict[str, Any], allow_layout_change: bool, allow_precision_change: bool
) -> TrainConfig:
    """The config of ``--resume RUN_DIR`` (``ftkit.train.recovery.resume_plan.resume_config``); ``--out``
    and ``--overwrite`` do not go with it."""
    from ftkit.errors import UsageError
    from ftkit.train.recovery.resume_plan import resume_config

    for name in ("out", "overwrite"):
        if name in values:
            raise UsageError(
                f"--resume does not take --{name}: the run continues in {run_dir}",
                hint="drop --" + name + " (or start a new run without --resume)",
            )
    return resume_config(
        run_dir, values, allow_layout_change=allow_layout_change, allow_precision_change=allow_precision_change
    )


def register(app: typer.Typer) -> None:
    # Over 80 lines for a reason: Typer reads the options from ``train``'s signature, one
    # parameter per option (named for its config field: ``given_values`` relies on it); the
    # body after the docstring is short, and the work is in ftkit.train.
    @app.command("train")
    def train(
        out: Annotated[Path | None, opt("--out", "-o", field="out", file_okay=False)] = None,
        cells: Annotated[int | None, opt("--cells", field="cells")] = None,
        tp: Annotated[int | None, opt("--tp", field="tp")] = None,
        pp: Annotated[
            int | None,
            opt("--pp", field="pp", help="Pipeline-parallel ranks per cell (stages; must divide the model's layers)."),
        ] = None,
        engines: Annotated[int | None, opt("--engines", field="engines")] = None,
        engine_kind: Annotated[EngineKind | None, opt("--engine", field="engine_kind")] = None,
        engine_placement: Annotated[EnginePlacement | None, opt("--engine-placement", field="engine_placement")] = None,
        engine_tp: Annotated[int | None, opt("--engine-tp", field="engine_tp", metavar="N", panel=PANEL_RL)] = None,
        logprob_tolerance: Annotated[
            float | None, opt("--logprob-tolerance", field="logprob_tolerance", metavar="DELTA", panel=PANEL_RL)
        ] = None,
        temperature: Annotated[
            float | None, opt("--temperature", field="temperature", metavar="T", panel=PANEL_SAMPLING)
        ] = None,
        top_p: Annotated[float | None, opt("--top-p", field="top_p", metavar="P", panel=PANEL_SAMPLING)] = None,
        top_k: Annotated[int | None, opt("--top-k", field="top_k", metavar="K", panel=PANEL_SAMPLING)] = None,
        stop: Annotated[list[str] | None, opt("--stop", field="stop", metavar="STRING", panel=PANEL_SAMPLING)] = None,
        ignore_eos: Annotated[
            bool | None,
            opt(
                "--ignore-eos/--stop-at-eos",
                field="ignore_eos",
                panel=PANEL_SAMPLING,
                help="Do not end a response at the tokenizer's eos token (vLLM's ignore_eos) [default: stop at eos].",
            ),
        ] = None,
        rollouts: Annotated[int | None, opt("--rollouts", field="rollouts")] = None,
        steps_per_rollout: Annotated[int | None, opt("--steps-per-rollout", field="steps_per_rollout")] = None,
        samples_per_rollout: Annotated[int | None, opt("--samples-per-rollout", field="samples_per_rollout")] = None,
        group_size: Annotated[int | None, opt("--group-size", field="group_size")] = None,
        lr: Annotated[float | None, opt("--lr", field="lr")] = None,
        loss: Annotated[Loss | None, opt("--loss", field="loss", panel=PANEL_RL)] = None,
        clip_low: Annotated[float | None, opt("--clip-low", field="clip_low", metavar="EPS", panel=PANEL_RL)] = None,
        clip_high: Annotated[float | None, opt("--clip-high", field="clip_high", metavar="EPS", panel=PANEL_RL)] = None,
        kl_coef: Annotated[float | None, opt("--kl-coef", field="kl_coef", metavar="BETA", panel=PANEL_RL)] = None,
        aggregation: Annotated[Aggregation | None, opt("--aggregation", field="aggregation", panel=PANEL_RL)] = None,
        micro_shards: Annotated[
            int | None,
            opt("--micro-shards", field="micro_shards", help="Micro-shards per optimizer step, at least --cells."),
        ] = None,
        model: Annotated[str | None, opt("--model", field="model", metavar="PRESET|PATH")] = None,
        seed: Annotated[int | None, opt("--seed", field="seed")] = None,
        reduce: Annotated[Reduce | None, opt("--reduce", field="reduce")] = None,
        reward: Annotated[str | None, opt("--reward", field="reward", metavar="REWARD")] = None,
        prompts: Annotated[str | None, opt("--prompts", field="prompts", metavar="FILE", panel=PANEL_DATA)] = None,
        input_key: Annotated[str | None, opt("--input-key", field="input_key", metavar="KEY", panel=PANEL_DATA)] = None,
        label_key: Annotated[str | None, opt("--label-key", field="label_key", metavar="KEY", panel=PANEL_DATA)] = None,
        max_prompt_len: Annotated[
            int | None, opt("--max-prompt-len", field="max_prompt_len", metavar="N", panel=PANEL_DATA)
        ] = None,
        eval_prompts: Annotated[
            str | None, opt("--eval-prompts", field="eval_prompts", metavar="FILE", panel=PANEL_DATA)
        ] = None,
        response_len: Annotated[
            int | None, opt("--max-response-len", field="response_len", metavar="N", panel=PANEL_DATA)
        ] = None,
        device: Annotated[Device | None, opt("--device", field="device")] = None,
        precision: Annotated[Precision | None, opt("--precision", field="precision")] = None,
        ray_address: Annotated[str | None, opt("--ray-address", field="ray_address", metavar="ADDRESS")] = None,
        dump_rollouts: Annotated[
            str | None, opt("--dump-rollouts", field="dump_rollouts", metavar="LIST", panel=PANEL_DUMPS)
        ] = None,
        dump_what: Annotated[
            str | None,
            opt(
                "--dump-what",
                field="dump_what",
                metavar="LIST",
                panel=PANEL_DUMPS,
                help="Comma list of activations, grads, weights; or none.",
            ),
        ] = None,
        dump_cells: Annotated[DumpCells | None, opt("--dump-cells", field="dump_cells", panel=PANEL_DUMPS)] = None,
        collective_timeout: Annotated[
            float | None,
            opt("--collective-timeout", field="collective_timeout", metavar="SECONDS", panel=PANEL_FAULTS),
        ] = None,
        step_timeout: Annotated[
            float | None, opt("--step-timeout", field="step_timeout", metavar="SECONDS", panel=PANEL_FAULTS)
        ] = None,
        min_cells: Annotated[int | None, opt("--min-cells", field="min_cells", panel=PANEL_FAULTS)] = None,
        max_retries: Annotated[int | None, opt("--max-retries", field="max_retries", panel=PANEL_FAULTS)] = None,
        heal: Annotated[
            bool | None,
            opt(
                "--heal/--no-heal",
                field="heal",
                panel=PANEL_FAULTS,
                help="Restart failed cells and heal them from a live peer [default: heal].",
            ),
        ] = None,
        heal_timeout: Annotated[
            float | None, opt("--heal-timeout", field="heal_timeout", metavar="SECONDS", panel=PANEL_FAULTS)
        ] = None,
        reward_timeout: Annotated[
            float | None, opt("--reward-timeout", field="reward_timeout", metavar="SECONDS", panel=PANEL_FAULTS)
        ] = None,
        inject: Annotated[
            list[str] | None,
            opt(
                "--inject",
                field="inject",
                metavar="SPEC",
                panel=PANEL_FAULTS,
                help="Inject a fault (repeatable): kind=...,point=...,cell=...,step=...; see docs/fault-injection.md.",
            ),
        ] = None,
        chaos: Annotated[str | None, opt("--chaos", field="chaos", metavar="SPEC", panel=PANEL_FAULTS)] = None,
        checkpoint_every: Annotated[
            int | None, opt("--checkpoint-every", field="checkpoint_every", metavar="N", panel=PANEL_CKPT)
        ] = None,
        keep_last: Annotated[int | None, opt("--keep-last", field="keep_last", metavar="N", panel=PANEL_CKPT)] = None,
        keep_best: Annotated[int | None, opt("--keep-best", field="keep_best", metavar="K", panel=PANEL_CKPT)] = None,
        best_metric: Annotated[BestMetric | None, opt("--best-metric", field="best_metric", panel=PANEL_CKPT)] = None,
        config: Annotated[
            Path | None,
            opt(
                "--config",
                metavar="FILE",
                dir_okay=False,
                help="Read config values from a JSON or TOML file; options given on the command line override them.",
            ),
        ] = None,
        print_config: Annotated[
            bool, opt("--print-config", help="Print the resulting config as JSON and exit.")
        ] = False,
        overwrite: Annotated[bool, opt("--overwrite", field="overwrite")] = False,
        resume: Annotated[
            Path | None,
            opt(
                "--resume",
                metavar="RUN_DIR",
                file_okay=False,
                panel=PANEL_CKPT,
                help="Continue the run in RUN_DIR from its newest checkpoint that verifies (older ones on "
                "failure, the seed without any), with its run.json config; --rollouts may be raised, "
                "--cells/--engines and fault options changed; options that change the result are an error.",
            ),
        ] = None,
        allow_layout_change: Annotated[
            bool,
            opt(
                "--allow-layout-change",
                panel=PANEL_CKPT,
                help="With --resume: let --tp/--pp differ from the run's recorded layout. The result is then "
                "not bitwise the uninterrupted run's; the change is logged (run_resumed.layout_change) and "
                "reported as a layout change.",
            ),
        ] = False,
        allow_precision_change: Annotated[
            bool,
            opt(
                "--allow-precision-change",
                panel=PANEL_CKPT,
                help="With --resume: let --precision differ from the run's recorded precision. The result is "
                "then not bitwise the uninterrupted run's; the change is logged (run_resumed.precision_change).",
            ),
        ] = False,
        fmt: FormatOpt = Format.human,
        report_to: Annotated[
            list[str] | None, opt("--report-to", field="report_to", metavar="TRACKER", panel="Output")
        ] = None,
        merged_log: Annotated[
            Path | None,
            typer.Option(
                "--merged-log",
                metavar="FILE",
                dir_okay=False,
                callback=report_path,
                help="Also write the run's event log as one time-ordered file (.gz: compressed) at the "
                "end, for CI artefacts (`ftkit analyze FILE`); the per-process files stay the record.",
                rich_help_panel="Output",
            ),
        ] = None,
        expect_equal: Annotated[
            Path | None,
            typer.Option(
                "--expect-equal",
                metavar="RUN_DIR",
                help="At the end, compare this run with the reference run RUN_DIR step by step "
                "(`ftkit compare-runs`): exit 1 on a divergence -- the CI check that a change does not "
                "change the numerics.",
                rich_help_panel="Output",
            ),
        ] = None,
        junit_xml: JunitOpt = None,
        fail_on: FailOnOpt = FailOn.error,
    ) -> None:
        """Train: cells of megatron-core ranks under Ray, exact steps, full forensics.

        Runs an RL loop (engines generate, rewards, group-normalised advantages, K optimizer
        steps per rollout over micro-shards reduced exactly across cells) and writes the run
        directory: run.json, events/, rollouts/, dumps/, final/, status.json. --model is a
        preset or a Hugging Face causal-LM directory / .gguf file (the built-in addition task
        then goes through its tokenizer; `ftkit export RUN_OR_CHECKPOINT --hf OUT` writes the trained
        weights back out; docs/models.md). Then replays its
        own event log through the analyzer and prints the verdict. Faults (a dead, hung or
        erring rank, a failed collective, a dead engine, a lost node of a --ray-address
        cluster) are detected, the step is discarded everywhere and retried over the
        survivors, and failed cells are restarted and healed (on a cluster, cells and engines
        are spread over the nodes; docs/clusters.md): the result is bitwise that of the
        fault-free run. --resume RUN_DIR continues a stopped (even SIGKILLed) run from its
        newest checkpoint that verifies, to the same bits as if it had never stopped. Exit 1
        also when the run cannot go on (--min-cells, --max-retries);
        130 / 143 / 129 on SIGINT / SIGTERM / SIGHUP.
        """
        options = dict(locals())  # first: the parameters, each option named for its config field
        from ftkit.extras import require

        require("train", "ftkit train")
        from ftkit.train.config import load_config

        values: dict[str, Any] = read_config_file(config) if config is not None else {}
        values.update(given_values(options))
        for flag, given in (
            ("--allow-layout-change", allow_layout_change),
            ("--allow-precision-change", allow_precision_change),
        ):
            if given and resume is None:
                from ftkit.errors import UsageError

                raise UsageError(f"{flag} goes with --resume", hint="drop it, or add --resume RUN_DIR")
        from ftkit.train.plan.run_plan import build_plan

        if resume is not None:
            cfg = _resume_config(resume, values, allow_layout_change, allow_precision_change)
        else:
            cfg = load_config(values)
        plan = build_plan(cfg)  # the model resolved and digested once, for the whole run
        output = Output(fmt)
        if print_config:  # precision (and the tolerance that follows it) as given: ``auto`` stays portable
            recorded = plan.config.model_copy(update={"precision": cfg.precision, "generation": cfg.generation})
            output.data(json.dumps(recorded.model_dump(mode="json"), indent=2))
            raise typer.Exit(0)
        cfg = plan.config
        if expect_equal is not None:
            from ftkit.events.reader import discover

            discover([expect_equal])  # no log there: exit 2 before training
        from ftkit.train.plan.run_plan import eval_warnings
        from ftkit.train.rl.rewards import check_reward

        # The task (prompt and eval files read and checked whole) and a bad plug-in: exit 2 before Ray.
        task = plan.task.build()
        for note in eval_warnings(cfg, task):
            output.warn(note)
        check_reward(cfg.task.reward, task, cfg.rng.seed, cfg.recovery.reward_timeout)
        if cfg.generation.kind == "vllm":
            from ftkit.engines.vllm import require_vllm

            require_vllm()  # no vLLM virtualenv: exit 2 before Ray

        if cfg.output.report_to:
            from ftkit.integrations.tracking import check_report_to

            check_report_to(cfg.output.report_to)  # a tracker that cannot start: exit 2 before Ray
        from ftkit.train.control.driver import run_training

        if output.human:
            sampling = cfg.sampling.describe()
            output.info(
                f"training {cfg.cluster.cells} cell(s) x tp {cfg.layout.tp} x pp {cfg.layout.pp}, "
                f"{cfg.engine.count} engine(s), {cfg.schedule.rollouts} rollout(s) x "
                f"{cfg.batch.steps_per_rollout} step(s), model {cfg.model.preset}, "
                f"precision {plan.precision}, reduce {cfg.reduction.reduce}"
                + (f", sampling {sampling}" if sampling else "")
                + f" -> {cfg.output.out}"
            )
        from ftkit.integrations.tracking import TrackingFeed, open_trackers
        from ftkit.report.live import live_view

        run_dir = Path(cfg.output.out)
        feed = TrackingFeed(
            open_trackers(cfg.output.report_to, run_dir), run_dir, cfg.batch.steps_per_rollout, resume is not None,
            output.warn,
        )  # fmt: skip
        with live_view(output, cfg.total_steps, cfg.cluster.cells, run_dir / "events") as view:

            def on_step(report: Any) -> None:
                view.on_step(report)
                feed.poll()

            def on_event(type_: str, fields: dict[str, Any]) -> None:
                view.on_event(type_, fields)
                feed.poll()

            try:
                result = run_training(
                    plan, on_step=on_step, on_event=on_event, resume=resume is not None, on_warning=output.warn
                )
            finally:
                feed.close()  # the metrics logged after the last step; every tracker ended
        if merged_log is not None:
            from ftkit.events.merge import write_merged_log

            merged = write_merged_log(result.run_dir / "events", merged_log)
            output.info(f"merged event log: {merged_log} ({merged.lines} lines)")
        for note in result.analysis.notes:
            output.warn(note)
        from ftkit.commands.train_report import verdict_report, with_expect_equal
        from ftkit.report.emit import emit

        shown = verdict_report(result, fail_on)
        if expect_equal is not None:
            from ftkit.runs.compare import compare_runs

            shown = with_expect_equal(shown, compare_runs([expect_equal], [result.run_dir]))
        raise typer.Exit(emit(output, shown, junit_xml=junit_xml))
