"""The data decision and the plan: `decision_run` trains the proxy on both arms, `data_decision`
judges it (verdict, gate, economics), `training_plan` plans the full run on the booked hardware.
Bodies fetch resources and the partition key, call the core, and report metadata."""

import dataclasses
from pathlib import Path

import dagster as dg
from dagster._core.errors import DagsterInvalidPropertyError

from ito_assets import charts
from ito_assets.data.stages import CleanStage
from ito_assets.defs import owners
from ito_assets.defs.decision.params import DataDecisionParams, DecisionRunParams
from ito_assets.defs.decision.resources import BookedHardwareResource
from ito_assets.defs.failures import core_config, failure, training_manifest_or_fail
from ito_assets.defs.metadata_values import chart, json_value, table
from ito_assets.defs.manifest.partitions import manifests_partitions
from ito_assets.data import lineage
from ito_assets.defs.resources import ItoSettingsResource, WAREHOUSE_POOL
from ito_assets.errors import ErrorCode, ItoError
from ito_assets.evals.suite import EvalSuite
from ito_assets.manifest.discovery import ManifestVerdict
from ito_assets.manifest.schema import Manifest
from ito_assets.manifest.verify import eval_suite_mismatches
from ito_assets.posttraining.plan import read_pair_shapes
from ito_assets.training.decision import DecisionResult, ordered_sha256, run_decision
from ito_assets.training.decision_gate import DataDecision, baseline_record, judge_decision, require_items_for_a_verdict
from ito_assets.training.economics import Economics
from ito_assets.training.mixtures import DEFAULT_BASELINE_URIS, read_mixture
from ito_assets.training.threads import torch_threads
from ito_assets.training.run_plan import PlanOutcome, plan_outcome
from ito_assets.training.verdict import MIN_ITEMS_PER_BENCHMARK, PairedTest, Verdict

GROUP = "decision"


@dg.asset(
    group_name=GROUP,
    owners=[owners.RESEARCH],
    kinds={"torch"},
    partitions_def=manifests_partitions,
    ins={"clean_shards": dg.AssetIn("clean_shards")},
    description="The proxy trained on the candidate mixture (`clean_shards`) and on the baseline mixture "
    "(the manifest's `decision_baseline`, each file at its sha256; where it binds none, the run config's "
    "`baseline_uris`), same token budget and seeds, scored on "
    "`eval_suite`'s battery (DataDecide method).",
)
def decision_run(
    context: dg.AssetExecutionContext, config: DecisionRunParams, ito: ItoSettingsResource,
    training_manifest: ManifestVerdict, eval_suite: EvalSuite, clean_shards: CleanStage,
) -> DecisionResult:
    manifest = training_manifest_or_fail(training_manifest, "the decision").manifest
    # Every value of the run config is checked before anything is read or fitted (USAGE_ERROR).
    decision = core_config("decision_run", lambda: config.to_config().with_power(manifest.decision_power))
    settings = ito.settings()
    try:
        # `eval_suite` is one output for every partition: another run may have stored another suite,
        # against which this data was never decontaminated.
        if eval_suite_mismatches(manifest, eval_suite.suite_id, eval_suite.digest):
            raise ItoError(ErrorCode.EVAL_SUITE_MISMATCH, f"the stored eval suite ({eval_suite.suite_id}, "
                           f"{eval_suite.digest[:19]}) is not the one the manifest's data was decontaminated against: "
                           "materialize eval_suite from that suite")
        require_items_for_a_verdict(manifest, (item.benchmark for item in eval_suite.items))
        uris, digests = _baseline_files(manifest, config, settings.decision_config.get("baseline_uris"))
        baseline = read_mixture(uris, settings.data_root, sha256=digests)
    except ItoError as error:
        raise failure(error) from None
    candidate = clean_shards.shards.read(["text"])["text"].to_list()
    shards = tuple(s.sha256 for s in clean_shards.shards.shards)
    attempt = 1 + _earlier_non_go(context, ordered_sha256(shards))
    decision = decision.for_attempt(attempt)
    work_dir = settings.state_dir / "decision" / context.partition_key
    launch = arm_launch(config)
    try:
        with torch_threads(config.num_threads):
            result = run_decision(candidate_texts=candidate, baseline_texts=baseline.texts, eval_items=eval_suite.items,
                                  config=decision, work_dir=work_dir, trainer=launch)
    except ItoError as error:
        raise failure(error) from None
    # The shards judged, so that training refuses this verdict for shards prepared again since, and
    # the baseline's files, so that a verdict names what it was measured against.
    result = dataclasses.replace(result, candidate_shards=shards, baseline_sources=baseline.sources, attempt=attempt,
                                 baseline_bound=manifest.decision_baseline is not None)
    if manifest.decision_baseline is None:
        context.log.warning("the manifest binds no decision_baseline: the candidate was measured against the run "
                            "config's baseline_uris, which no reviewer bound")
    context.add_output_metadata({**_run_metadata(result, work_dir), **_launch_metadata(launch)})
    return result


def _baseline_files(manifest: Manifest, config: DecisionRunParams,
                    location_default: object) -> tuple[list[str], list[str] | None]:
    """(uris, their reviewed sha256) of the baseline: the manifest's where it binds one; else the
    run config's, unbound (None). A run that names other files than a binding is refused
    (USAGE_ERROR); the defaults, the code's and the location's (`location_default`, from
    ITO_DECISION_CONFIG), are for manifests that bind none, so they give way to a binding."""
    if manifest.decision_baseline is None:
        return list(config.baseline_uris), None
    uris = [f.uri for f in manifest.decision_baseline]
    if list(config.baseline_uris) not in (uris, list(DEFAULT_BASELINE_URIS), location_default):
        raise ItoError(ErrorCode.USAGE_ERROR, "baseline_uris: the manifest binds the decision's baseline "
                       "(decision_baseline); a run config may not name other files")
    return uris, [f.sha256 for f in manifest.decision_baseline]


# Read from the event log: the decisions of the same candidate shards before this one.
CANDIDATE_DIGEST_KEY = "candidate_shards_sha256"
_PAGE = 100


def _run_id(context: dg.AssetExecutionContext) -> str:
    """The Dagster run's id; an asset invoked directly, outside any run, has Dagster's name for none."""
    try:
        return context.run.run_id
    except DagsterInvalidPropertyError:
        return "EPHEMERAL"


def _earlier_non_go(context: dg.AssetExecutionContext, candidate_sha256: str) -> int:
    """How many materializations of this partition's decision_run judged the same candidate shards
    (by CANDIDATE_DIGEST_KEY) and were not a GO: a decision run again until it says GO has had as
    many chances at a false GO."""
    records_filter = dg.AssetRecordsFilter(asset_key=dg.AssetKey("decision_run"), asset_partitions=[context.partition_key])
    count, cursor = 0, None
    while True:
        page = context.instance.fetch_materializations(records_filter, limit=_PAGE, cursor=cursor)
        for record in page.records:
            metadata = record.asset_materialization.metadata if record.asset_materialization else {}
            same = getattr(metadata.get(CANDIDATE_DIGEST_KEY), "value", None) == candidate_sha256
            if same and getattr(metadata.get("verdict"), "value", None) != Verdict.GO.value:
                count += 1
        if not page.has_more:
            return count
        cursor = page.cursor


# An arm lasts seconds on the embedded default: its supervisor polls every second, not every five,
# or each arm would idle up to five seconds after its worker finished.
ARM_POLL_S = 1.0
ARM_FALLBACK_COLUMNS = [("field", "string"), ("planned", "string"), ("ran", "string"), ("why", "string")]


def arm_launch(config: DecisionRunParams):
    """How the arms train here: on the stage worker, with a layout of one micro-batch per step fitted to
    one rank as the training runtime's defaults fit a stage (precision, compile); None: in this process.
    The plan's own layout comes after the decision, which it depends on."""
    if config.trainer == "in_process":
        return None
    import torch  # a decision run's import, not the code location's

    from ito_assets.defs.training.resources import TrainingRuntimeResource
    from ito_assets.runtime.stage.fitting import fit_layout
    from ito_assets.runtime.stage.proxy_arm import ArmLaunch
    from ito_assets.runtime.worker.execution import native_cpu_bf16
    from ito_assets.training.layout import Layout

    runtime, has_cuda = TrainingRuntimeResource(), torch.cuda.is_available()
    layout, fallbacks = fit_layout(
        Layout(micro_batch_size=config.batch_size), world_size=1, replica_groups=1, batch_size=config.batch_size,
        eager_reason=runtime.eager_reason(has_cuda=has_cuda),
        fp32_reason=runtime.fp32_reason(has_cuda=has_cuda, native_cpu_bf16=native_cpu_bf16()))
    supervisor = dataclasses.replace(runtime.supervisor(nnodes=1, nproc_per_node=1), poll_interval_s=ARM_POLL_S)
    return ArmLaunch(layout=layout, fallbacks=fallbacks, supervisor=supervisor)


def _launch_metadata(launch) -> dict:
    """Where the arms trained, and what the layout a plan would ask for changed on this host."""
    if launch is None:
        return {"arms_trained_on": "this process (the trainer's loop)"}
    rows = [{"field": f.field, "planned": str(f.planned), "ran": str(f.ran), "why": f.reason} for f in launch.fallbacks]
    return {"arms_trained_on": "the stage worker (under the supervisor)",
            "arm_layout_fallbacks": table(ARM_FALLBACK_COLUMNS, rows)}


def _test_table(test: PairedTest) -> dg.TableMetadataValue:
    """The paired test as one sortable row; the interval and its figures are empty with one seed."""
    figures = {"num_seeds": test.num_seeds, "degrees_of_freedom": test.degrees_of_freedom,
               "difference": test.difference, "interval_low": test.interval_low,
               "interval_high": test.interval_high, "p_value": test.p_value,
               "minimum_detectable_effect": test.minimum_detectable_effect}
    columns = [("verdict", "string"), ("method", "string"), ("confidence", "float")]
    columns += [(name, "int" if name in ("num_seeds", "degrees_of_freedom") else "float") for name in figures]
    return table(columns, [{"verdict": test.verdict.value, "method": test.method, "confidence": test.confidence, **figures}])


RUN_COLUMNS = [("arm", "string"), ("seed", "int"), ("answer bits/byte", "float"), ("accuracy %", "float"),
               ("P(correct) %", "float"), ("final loss", "float"), ("tokens/s", "float")]
PLAN_STAGE_COLUMNS = [("stage", "string"), ("layout", "string"), ("GiB/GPU", "float"), ("MFU %", "float"),
                      ("steps", "int"), ("cost USD", "float")]
POST_TRAINING_COLUMNS = [("stage", "string"), ("ranks", "int"), ("steps", "int"), ("positions", "int"),
                         ("worker s", "float"), ("host s", "float"), ("cost USD", "float")]


def _run_metadata(result: DecisionResult, work_dir: Path) -> dict:
    rows = [{"arm": r.arm, "seed": r.seed, "answer bits/byte": round(r.primary, 4),
             "accuracy %": round(100 * r.report.metric("accuracy"), 1),
             "P(correct) %": round(100 * r.report.metric("correct_prob"), 1), "final loss": round(r.train.final_loss, 3),
             "tokens/s": round(r.train.tokens_per_second)} for r in result.runs]
    return {
        "verdict": result.verdict.value,
        "difference_bits_per_byte": result.difference,
        "paired_test": _test_table(result.test),
        "explanation": result.explanation,
        "model": result.model_name,
        "scale": result.scale,
        "num_parameters": result.num_parameters,
        "num_tokens_per_run": result.num_tokens_per_run,
        "num_runs": len(result.runs),
        "seeds": ", ".join(str(seed) for seed in sorted({r.seed for r in result.runs})),
        "target_detectable_effect": result.config.target_detectable_effect or 0.0,
        "train_wall_seconds": round(result.train_wall_seconds, 2),
        "tokenizer_sha256": result.tokenizer_sha256 or "",
        "work_dir": dg.MetadataValue.path(str(work_dir)),
        "baseline_sources": json_value([vars(s) for s in result.baseline_sources]),
        "baseline_sha256": result.baseline_sha256 or "",
        CANDIDATE_DIGEST_KEY: ordered_sha256(result.candidate_shards or ()),
        "attempt": result.attempt,
        "confidence": result.test.confidence,
        "items": _items_metadata(result),
        "runs": table(RUN_COLUMNS, rows),
    }


def _items_metadata(result: DecisionResult) -> dg.JsonMetadataValue:
    """Each benchmark's number of eval items, and the interval over items the verdict also needs."""
    return json_value({"num_items_by_benchmark": dict(result.num_items_by_benchmark),
                       "min_items_per_benchmark": MIN_ITEMS_PER_BENCHMARK,
                       "item_test": result.item_test.to_dict() if result.item_test else None})


@dg.asset(
    group_name=GROUP,
    owners=[owners.RESEARCH],
    kinds={"python"},
    partitions_def=manifests_partitions,
    # It records the proxies' consumption of the clean shards in the warehouse: here, a short step,
    # not in `decision_run`, which would hold the warehouse's one writer slot while the proxies train.
    pool=WAREHOUSE_POOL,
    description="The data decision, judged from `decision_run` with the manifest and the booked hardware: "
    "GO / NO_GO / WITHIN_NOISE / INCONCLUSIVE from a paired t-test over seeds (95% interval); NOT_WORTH_IT "
    "for a GO whose gain does not pay for the full run; the gate (a GO worth its cost, or an outcome the manifest's "
    "reviewers accepted); the economics: decision cost, projected full-run cost, cost per point of improvement.",
)
def data_decision(
    context: dg.AssetExecutionContext, config: DataDecisionParams, booked_hardware: BookedHardwareResource,
    ito: ItoSettingsResource, training_manifest: ManifestVerdict, decision_run: DecisionResult,
) -> DataDecision:
    manifest = training_manifest_or_fail(training_manifest, "the decision").manifest
    _record_proxies_consumption(context, ito, training_manifest, decision_run)
    judged = judge_decision(decision_run, manifest, booked_hardware.hardware(), core_config("data_decision", config.to_config))
    metadata = {"verdict": judged.decision.verdict.value, "outcome": judged.gate.outcome,
                "gate_passed": judged.gate.passed, "gate_reason": judged.gate.reason,
                "summary": json_value(judged.summary()), **_effect_metadata(judged),
                "baseline_sha256": judged.decision.baseline_sha256 or "",
                "baseline": json_value(baseline_record(judged.decision))}
    if judged.economics is not None:
        metadata["economics"] = _economics_table(judged.economics)
        metadata["full_run_cost_usd"] = round(judged.economics.full_run_cost_cents / 100, 2)
        metadata["worth_it"] = judged.economics.worth_it
    else:
        metadata["plan_refusal"] = judged.plan_refusal or ""
    context.add_output_metadata(metadata)
    return judged


def _record_proxies_consumption(context, ito: ItoSettingsResource, verdict: ManifestVerdict,
                                result: DecisionResult) -> None:
    """Lineage for auditors: the decision's proxy arms trained on these clean shards (recorded
    under the Dagster run that judged them; a decision stored before it named its shards, none)."""
    if not result.candidate_shards:
        return
    try:
        lineage.record_consumption(ito.settings().warehouse_path, list(result.candidate_shards), _run_id(context),
                                   "decision_run", verdict.digest)
    except ItoError as error:
        raise failure(error) from None


def _effect_metadata(judged: DataDecision) -> dict:
    """The effect the decision rests on, with its interval, as a chart and as numbers (plotted across
    partitions); the interval is absent with one seed."""
    test = judged.decision.test
    png = charts.effect_chart(test.difference, test.interval_low, test.interval_high, test.verdict.value,
                              unit="answer bits/byte", minimum_detectable_effect=test.minimum_detectable_effect)
    interval = {name: value for name, value in (("interval_low", test.interval_low), ("interval_high", test.interval_high))
                if value is not None}
    return {"effect_chart": chart("data decision effect", png), "difference_bits_per_byte": test.difference, **interval}


def _economics_table(economics: Economics) -> dg.TableMetadataValue:
    """One row per figure, in the unit a desk reads; a threshold the manifest does not set is absent."""
    figures = [
        ("decision job cost", economics.decision_cost_cents / 100, "USD"),
        ("full run projected cost", economics.full_run_cost_cents / 100, "USD"),
        ("decision job / full run", economics.decision_cost_fraction * 100, "%"),
        ("relative improvement", economics.relative_improvement * 100, "%"),
    ]
    if economics.cost_cents_per_improvement_point is not None:
        figures.append(("full run cost per point of improvement", economics.cost_cents_per_improvement_point / 100, "USD"))
    if economics.max_cost_cents_per_improvement_point is not None:
        figures.append(("manifest's maximum per point", economics.max_cost_cents_per_improvement_point / 100, "USD"))
    return table([("figure", "string"), ("value", "float"), ("unit", "string")],
                 [{"figure": name, "value": round(value, 4), "unit": unit} for name, value, unit in figures])


@dg.asset(
    group_name=GROUP,
    owners=[owners.RESEARCH],
    kinds={"python"},
    partitions_def=manifests_partitions,
    description="The parallelism and precision plan of every curriculum stage of the manifest on the booked "
    "hardware, after `data_decision`: degrees, precision, checkpointing, memory per GPU, step time, MFU "
    "and cost; refusals by stable reason.",
)
def training_plan(
    context: dg.AssetExecutionContext, ito: ItoSettingsResource, booked_hardware: BookedHardwareResource,
    training_manifest: ManifestVerdict, data_decision: DataDecision,
) -> PlanOutcome:
    manifest, hardware = training_manifest_or_fail(training_manifest, "the decision").manifest, booked_hardware.hardware()
    try:
        shapes = read_pair_shapes(manifest.post_training, ito.settings().data_root,
                                  held_out_fraction=manifest.post_training_eval.held_out_fraction)
        outcome, unplanned = plan_outcome(manifest, hardware, pair_shapes=shapes), None
    except ItoError as error:
        # Shown, not failed: gate 5 and `training_tokens` refuse such a recipe before any compute.
        outcome, unplanned = plan_outcome(manifest, hardware, pair_shapes=None), f"{error.code.value}: {error.message}"
    context.add_output_metadata({**_plan_metadata(outcome, data_decision),
                                 **({"post_training_unplanned": unplanned} if unplanned else {})})
    return outcome


def _layout_text(layout: dict) -> str:
    """A layout in one cell: the parallel degrees above 1, then precision, checkpointing, micro-batch
    and compile (the full layout is in `plan`)."""
    settings = {"precision", "checkpointing", "micro_batch_size", "compile"}
    degrees = [f"{name}={value}" for name, value in layout.items() if name not in settings and value != 1]
    rest = [layout["precision"], f"checkpointing {layout['checkpointing']}", f"micro-batch {layout['micro_batch_size']}"]
    return ", ".join((degrees or ["one device"]) + rest + (["compile"] if layout["compile"] else []))


def _plan_metadata(outcome: PlanOutcome, decision: DataDecision) -> dict:
    metadata = {"refused": outcome.refused, "decision_verdict": decision.decision.verdict.value,
                "plan": json_value(outcome.to_dict())}
    if outcome.run_plan is None:
        return {**metadata, "refusal_reasons": ", ".join(outcome.refusal_reasons)}
    plan = outcome.run_plan
    rows = [{"stage": s.stage, "layout": _layout_text(s.plan.layout.describe()), "GiB/GPU": round(s.plan.memory.total / 2**30, 1),
             "MFU %": round(100 * s.plan.step.mfu, 1), "steps": s.plan.num_steps, "cost USD": round(s.plan.cost_cents / 100, 2)}
            for s in plan.stages]
    post = [{"stage": p.stage, "ranks": p.num_ranks, "steps": p.num_steps, "positions": p.sequence_length,
             "worker s": round(p.worker_seconds, 3), "host s": round(p.host_seconds, 3),
             "cost USD": round(p.cost_cents / 100, 2)} for p in plan.post_training or ()]
    return {
        **metadata, "cost_cents": plan.cost_cents, "cap_cents": plan.budget.cap_cents,
        "max_incremental_cents": plan.budget.max_incremental_cents, "wall_hours": round(plan.wall_seconds / 3600, 4),
        "stages": table(PLAN_STAGE_COLUMNS, rows), "post_training_included": plan.post_training_included,
        **({"post_training": table(POST_TRAINING_COLUMNS, post)} if post else {}),
    }
