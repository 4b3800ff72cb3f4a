"""The papers' findings in miniature, on the embedded default, with Ray Tune (resumable).

Each finding (``rllib_search/recipes/findings/study.py``) is a set of arms, config transforms of one base
recipe (Search-R1's GRPO, or R-Search's for the evidence reward) trained from ONE shared warm start per
finding (the λ_f finding from a weaker one): every arm gets the same iterations, batch, learning rate and
seeds. Every arm is a Tune experiment under ``--out``/tune whose trials are its seeds; each trial is evaluated
greedily on held-out questions (``--held-out-per-hop`` per hop count) at its last iteration, question by
question, so an arm's EM and an arm-vs-arm difference get bootstrap intervals
(``algos/evaluation/scores.py``).

    masking           Search-R1 Table 4: retrieved-token masking on vs off
    lambda_format     empirical study: λ_f 0 vs 0.2 from a weaker warm start
    lambda_retrieval  empirical study: λ_r 0 vs 0.1
    retrievers        dense (bundled MiniLM, Flat) vs BM25 vs random passages
    algorithms        GRPO vs PPO vs REINFORCE++
    losses            GRPO vs GSPO vs Dr. GRPO, each with and without LLDS (5 seeds: --seeds 0,1,2,3,4)
    evidence          R-Search's evidence reward on vs off (the served Gemma-3-270M judge)

Each finding also evaluates its warm start once (greedy, before any RL) and reports it as a row, with each
arm's paired gain over it; intervals resample seeds, then questions; each comparison states its power (the
difference its seeds can detect, and the seeds the paper's reported difference would need).

``--warm-start DIR`` starts the Search-R1 findings from the main job's warm start instead of one of their own:
DIR is the output of ``python tuned_examples/tiny_cpu_grpo.py --rl-iterations 0 --seed S --world-seed W
--out DIR`` (its ``warm_start_model/``, whose held-out 2-hop EM is above 0); the findings then run on its
world (``--seed W``) with its protocol, turn budget and top-k. The λ_f finding (a weaker warm start by
design) and R-Search's (another protocol) keep their own.

    python tuned_examples/findings.py --warm-start ~/runs/warm_1000 --seed 1000 --seeds 0,1,2,3,4

Run the same command again and it resumes: finished arms are read back, unfinished ones continue from their
checkpoints (``tune.Tuner.restore``; ``--fresh`` starts over), so the full study (hours on two CPU cores)
can span sessions. It also spans machines: a finding whose every arm is already analysed in the results
file (``--json``, committed) with the same run settings and at its base recipe's turn budget is kept, not
run again, and the report merges it with what ran here (with nothing left to run, no Ray is started); one
measured at another turn budget is trained again. Within a finding, an arm whose trials the results file
holds (same settings, and a warm start that answers the held-out questions as this run's does) is kept
too: the other arms train and the report analyses them together, so a long finding can grow an arm at a
time, e.g. ``--findings losses`` on one machine today and again tomorrow. An arm's Tune experiment is
named with its turn budget (``masking__masking_on__64_tokens``), so one trained at another budget is
neither resumed nor reported as this one. It writes ``docs/findings.md`` (one table: each arm's held-out
EM with its 95% interval, the paper's direction and whether it reproduced here; learning-curve PNGs under
``docs/findings/``) and ``docs/findings/findings.json`` (each arm's trials with their answers), from every
arm's results found under ``--out`` ("not yet run" for the rest); ``--smoke`` writes them under ``--out``
instead.

    python tuned_examples/findings.py                       # the whole study: 7 findings, 3 seeds, SmolLM2
    python tuned_examples/findings.py --findings masking,evidence --seeds 0,1,2 --iterations 10
    python tuned_examples/findings.py --report-only         # rewrite the report from the results so far
    python tuned_examples/findings.py --smoke       # one finding, one seed, the smallest size: minutes

To check the committed results, train some arms again and set them beside them, seed by seed (the
committed report is left alone; ``rllib_search/recipes/findings/check.py`` says what carries across CPUs):

    python tuned_examples/findings.py --check --findings masking --arms "masking on" --seeds 0
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rllib_search.recipes import r_search_grpo, search_r1_grpo
from rllib_search.recipes.findings import check as checking
from rllib_search.recipes.findings import study
from rllib_search.recipes.jobs import RecipeJob, job_arguments, output_directory
from rllib_search.recipes.scales import CPU_JUDGE, CPU_JUDGE_EXAMPLES
from rllib_search.recipes.sweeps import fit_or_restore, restored_results
from rllib_search.recipes.tiny_cpu.answer_cache import weights_digest

ROOT = Path(__file__).resolve().parents[1]
MINILM = "all-minilm-l6-v2"
# The evidence judge the study serves (recipes/embedded.serve_judge's defaults): a finding that needs a judge
# and was measured with another is trained again.
JUDGE = {"model": CPU_JUDGE, "examples": CPU_JUDGE_EXAMPLES}
SIZES = {  # iterations are --iterations (default: 10; smoke 1)
    "embedded": {"seeds": (0, 1, 2), "per_hop": 50, "warm_start": 8, "weak_warm_start": 3},
    # The smoke runs one finding (its two arms, Tune, the evaluation and the report: the path every finding
    # takes) unless --findings names others: each arm costs a Tune trial with the model loaded again.
    "smoke": {"seeds": (0,), "per_hop": 3, "warm_start": 1, "weak_warm_start": 1, "findings": ["masking"]},
}


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = job_arguments(__doc__, iterations=10)
    parser.add_argument(
        "--findings", type=lambda s: s.split(","), help="comma-separated (default: all; smoke: masking)"
    )
    parser.add_argument("--seeds", type=ints, help="e.g. 0,1,2 (default 0,1,2; smoke 0)")
    parser.add_argument("--held-out-per-hop", type=int, help="held-out questions per hop count (default 50)")
    parser.add_argument("--hops", type=ints, default=(1, 2), help="hop counts evaluated (default 1,2)")
    parser.add_argument(
        "--warm-start-steps", type=int, help="SFT steps of the shared warm start (default 8; smoke 1)"
    )
    parser.add_argument("--weak-warm-start-steps", type=int, help="the λ_f finding's (default 3)")
    parser.add_argument(
        "--warm-start",
        help="a main job's output directory (tiny_cpu_grpo.py --rl-iterations 0 --out DIR): the Search-R1 "
        "findings start from its warm_start_model/ on its world (--seed must be its world seed)",
    )
    parser.add_argument(  # Tune schedules by CPUs: on a machine with more cores than RAM for them, cap it
        "--max-concurrent",
        type=int,
        help="trials at once (default: one a CPU, one for the findings that serve a judge; a SmolLM2 trial "
        "holds up to 10 GB and the served Gemma judge up to 5 GB); an arm's experiment keeps the value it "
        "started with when resumed (then --num-cpus 1 runs one trial at a time)",
    )
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    parser.add_argument(
        "--check",
        action="store_true",
        help="train the selected findings' arms again under --out (default runs/findings_check) and compare "
        "each with the committed results in --json, seed by seed (check.md, check.json under --out); the "
        "committed report is left as it is",
    )
    parser.add_argument(
        "--arms",
        action="append",
        help="with --check: only this arm (its name as in the report, e.g. 'masking on'; repeat for more)",
    )
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report from --out")
    parser.add_argument("--markdown", help="report path (default docs/findings.md; smoke: --out)")
    parser.add_argument("--json", help="results path (default docs/findings/findings.json; smoke: --out)")
    args = parser.parse_args(argv)
    if args.data or args.retriever_url or args.held_out:
        parser.error("the findings run on the embedded default (no --data, --retriever-url, --held-out)")
    args.embedded = not args.smoke  # the study's scale is the embedded default's
    size = SIZES["smoke" if args.smoke else "embedded"]
    findings = study.select(args.findings or size.get("findings"))
    if args.arms and not args.check:
        parser.error("--arms chooses the arms --check trains again")
    try:
        arms = chosen_arms(findings, args.arms)
    except ValueError as err:
        parser.error(str(err))
    findings = [finding for finding in findings if arms[finding.key]]
    # Absolute (Tune reads results back by path) and, in a submitted job, outside its working directory.
    out = output_directory("findings_check" if args.check else "findings", args.out)
    args.out = str(out)  # the job's folder too
    markdown = Path(args.markdown or (out / "findings.md" if args.smoke else ROOT / "docs" / "findings.md"))
    json_path = Path(
        args.json or (out / "findings.json" if args.smoke else ROOT / "docs" / "findings" / "findings.json")
    )
    if args.report_only:
        write_report(out, markdown, json_path, print)
        return 0

    try:
        main_warm_start = read_main_warm_start(args.warm_start, args.seed) if args.warm_start else None
    except ValueError as err:
        parser.error(str(err))
    job = RecipeJob("findings", args)  # Ray starts on entering it, only if a finding is left to run
    seeds = args.seeds or size["seeds"]
    run = {
        "scale": "smoke" if args.smoke else "embedded",
        "model": args.model or "smollm2-135m-instruct",
        "world_seed": args.seed,
        "iterations": job.iterations,
        "seeds": list(seeds),
        "held_out_per_hop": args.held_out_per_hop or size["per_hop"],
        "hops": list(args.hops),
        "warm_start_steps": args.warm_start_steps or size["warm_start"],
        "weak_warm_start_steps": args.weak_warm_start_steps or size["weak_warm_start"],
        "main_warm_start": main_warm_start,
        "max_turn_tokens": turn_budgets(job, main_warm_start),
        "judge": JUDGE,
        "machine": machine(),
    }
    (job.out / "run.json").write_text(json.dumps(run, indent=2))
    if args.check:
        if not json_path.exists():
            parser.error(f"--check compares with {json_path}, which does not exist")
        with job:
            train(job, findings, arms, run, seeds, args)
        job.say("\n" + write_checked(job.out, json_path, run, findings, arms))
        return 0
    carried = carried_over(json_path, run)
    pending = to_run(findings, carried, run, fresh=args.fresh)
    for finding in findings:
        if finding not in pending:
            job.say(f"{finding.key}: every arm's results are in {json_path} (same run settings); kept")
        elif (analysis := carried.get(finding.key, {})).get("status") == "run":
            job.say(
                f"{finding.key}: measured at {study.measured_turn_budget(finding, analysis)} tokens a turn, "
                f"the recipe's budget is {run['max_turn_tokens'][finding.base]}: running it again"
            )
    if not pending:
        write_report(job.out, markdown, json_path, job.say)
        return 0
    with job:
        train(job, pending, arms, run, seeds, args, carried)
        write_report(job.out, markdown, json_path, job.say)
    return 0


def chosen_arms(findings: list[study.Finding], names: list[str] | None) -> dict[str, list[str]]:
    """Finding key -> the names of its arms to train: every arm without ``names``, else those named
    (case-insensitive); a name no selected finding has is an error that lists the ones it has."""
    if not names:
        return {finding.key: [arm.name for arm in finding.arms] for finding in findings}
    wanted = {name.strip().lower() for name in names}
    chosen = {
        finding.key: [arm.name for arm in finding.arms if arm.name.lower() in wanted] for finding in findings
    }
    found = {name.lower() for arms in chosen.values() for name in arms}
    if wanted - found:
        known = [f"{finding.key}: {arm.name!r}" for finding in findings for arm in finding.arms]
        raise ValueError(f"no arm named {sorted(wanted - found)} in the selected findings; they have {known}")
    return chosen


def read_main_warm_start(directory: str, world_seed: int) -> dict[str, Any]:
    """What the findings take from a main job's warm start (``--warm-start``): its model and the settings it
    was trained with; a directory that is not one, or one of another world than ``world_seed``, is refused."""
    root = Path(directory).expanduser().resolve()
    summary, model = root / "summary.json", root / "warm_start_model"
    if not summary.is_file() or not (model / "config.json").is_file():
        raise ValueError(
            f"--warm-start {root}: not a main job's output (it needs summary.json and warm_start_model/; "
            "make one with tuned_examples/tiny_cpu_grpo.py --rl-iterations 0 --out DIR)"
        )
    settings = json.loads(summary.read_text()).get("settings", {})
    missing = [key for key in ("world_seed", "protocol", "max_turn_tokens", "topk") if key not in settings]
    if missing:
        raise ValueError(f"--warm-start {summary}: its settings lack {missing}")
    if int(settings["world_seed"]) != int(world_seed):
        raise ValueError(
            f"--warm-start {root} was trained on world {settings['world_seed']}: pass --seed "
            f"{settings['world_seed']} so the findings run on its world"
        )
    return {
        "model": str(model),
        "weights_sha256": weights_digest(model),  # the warm start, whatever its folder
        "world_seed": int(settings["world_seed"]),
        "protocol": str(settings["protocol"]),
        "max_turn_tokens": int(settings["max_turn_tokens"]),
        "topk": int(settings["topk"]),
    }


def uses_main_warm_start(finding: study.Finding, run: dict[str, Any]) -> bool:
    """Whether ``finding`` starts from the main job's warm start (``--warm-start``): the Search-R1 findings
    that use the standard warm start."""
    return (
        bool(run.get("main_warm_start")) and finding.base == "search_r1" and finding.warm_start == "standard"
    )


def machine() -> dict[str, Any]:
    """The CPU, threads and torch a run's results come from (the findings' recipes train in fp32)."""
    import torch

    from rllib_search.llm.models import cpu_description

    return {**cpu_description(), "precision": "fp32", "torch": torch.__version__}


def train(
    job: RecipeJob,
    findings: list[study.Finding],
    arms: dict[str, list[str]],
    run: dict[str, Any],
    seeds: Any,
    args: Any,
    carried: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Train ``arms`` of ``findings`` (each finding's from its shared warm start) inside a started job, but
    those whose trials ``carried`` holds from the same settings and warm start (:func:`reusable_trials`)."""
    carried = carried or {}
    held_out = [
        record
        for hops in run["hops"]
        for record in job.world.records("test", hops=hops)[: run["held_out_per_hop"]]
    ]
    context = {"served_retriever": job.retriever()}
    if any("retrievers" in f.needs for f in findings):
        context["retrievers"] = retriever_specs(job)
    if any("judge" in f.needs for f in findings):
        context["judge"] = job.judge()
    job.say(
        f"findings {[f.key for f in findings]}: {job.iterations} iterations x seeds {list(seeds)} per "
        f"arm, {len(held_out)} held-out questions"
    )
    for finding in findings:
        budget = run["max_turn_tokens"][finding.base]
        base = base_recipe(job, finding, run, context, args)
        evaluate_warm_start(job, finding, base, held_out, budget)
        kept = (
            {}
            if args.fresh
            else reusable_trials(finding, carried, run, warm_start_answers(job.out, finding, budget))
        )
        for arm in finding.arms:
            if arm.name not in arms[finding.key]:
                continue
            if arm.name in kept:
                job.say(
                    f"{finding.key}: arm {arm.name!r}: its trials are in the results file (same settings "
                    "and warm start); kept"
                )
                continue
            config = study.arm_config(base, arm, context)
            config = config.held_out(dataset=held_out, interval=job.iterations, answers=True)
            run_arm(job, finding, arm, config, seeds, args, run["max_turn_tokens"][finding.base])


def write_checked(
    out: Path, json_path: Path, run: dict[str, Any], findings: list[study.Finding], arms: dict[str, list[str]]
) -> str:
    """``--check``'s report: the re-run arms under ``out`` against the committed ``json_path``, written to
    ``out``/check.md and check.json; returns the table."""
    reruns = {}
    for finding in findings:
        experiments = analysed_experiments(out, finding, run["max_turn_tokens"][finding.base])
        if experiments:
            reruns[finding.key] = study.analyse(finding, experiments)
    document = checking.check(json.loads(json_path.read_text()), run, reruns, arms)
    return checking.write_check(document, out / "check.md", out / "check.json")


def analysed_experiments(out: Path, finding: study.Finding, budget: int) -> dict[str, list[dict[str, Any]]]:
    """Arm name -> its trials' records, for each arm of ``finding`` with a Tune experiment under ``out``
    at the turn budget ``budget``."""
    trials = {}
    for arm in finding.arms:
        experiment = out / "tune" / study.experiment_name(finding, arm, budget)
        grid = restored_results(study.trainable(arm), experiment)
        if grid is not None:
            trials[arm.name] = [study.trial_record(result) for result in grid]
    return trials


def turn_budgets(job: RecipeJob, main_warm_start: dict[str, Any] | None = None) -> dict[str, int]:
    """Each base recipe's turn budget as the study trains it (CPU scale; smoke-sized under ``--smoke``; the
    main job's for Search-R1 under ``--warm-start``)."""
    search_r1 = search_r1_grpo(dataset=None, scale="cpu")
    if main_warm_start:
        search_r1.rollouts(max_turn_tokens=main_warm_start["max_turn_tokens"])
    return {
        "search_r1": job.smoke_sized(search_r1).max_turn_tokens,
        "r_search": job.smoke_sized(r_search_grpo(dataset=None, scale="cpu")).max_turn_tokens,
    }


def warm_start_file(out: Path, finding: study.Finding, budget: int) -> Path:
    """Where a finding's warm-start evaluation (its held-out answers) is kept under ``out``."""
    return out / "warm_start_eval" / f"{finding.key}__{budget}_tokens.json"


def evaluate_warm_start(
    job: RecipeJob, finding: study.Finding, base: Any, held_out: list[Any], budget: int
) -> None:
    """The finding's warm start (``base`` before any RL) on the held-out questions, greedy, once: its
    answers go to :func:`warm_start_file` (kept there: a resumed study reads them back)."""
    from rllib_search.algos.algorithm import held_out_answers

    path = warm_start_file(job.out, finding, budget)
    if path.exists():
        return
    job.say(f"{finding.key}: evaluating its warm start on {len(held_out)} held-out questions")
    algo = base.copy(copy_frozen=False).build_algo()
    try:
        answers = held_out_answers(held_out, algo.evaluate_questions(held_out))
    finally:
        algo.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(answers)


def warm_start_answers(out: Path, finding: study.Finding, budget: int) -> list[dict[str, Any]] | None:
    path = warm_start_file(out, finding, budget)
    return json.loads(path.read_text()) if path.exists() else None


def to_run(
    findings: list[study.Finding], carried: dict[str, dict[str, Any]], run: dict[str, Any], *, fresh: bool
) -> list[study.Finding]:
    """The findings to train: all with ``fresh``; otherwise those without every arm's results carried over,
    or carried over from a turn budget other than the one their base recipe has now, or (those that need a
    judge) from another judge than the run's."""
    return [
        finding
        for finding in findings
        if fresh
        or carried.get(finding.key, {}).get("status") != "run"
        or not measured_as_this_run(finding, carried[finding.key], run)
    ]


def measured_as_this_run(finding: study.Finding, analysis: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether ``finding``'s carried-over ``analysis`` was measured at this run's turn budget and, for a
    finding that needs one, with this run's judge."""
    if study.measured_turn_budget(finding, analysis) != run["max_turn_tokens"][finding.base]:
        return False
    return "judge" not in finding.needs or analysis.get("judge") == run.get("judge")


def base_recipe(
    job: RecipeJob, finding: study.Finding, run: dict[str, Any], context: dict[str, Any], args: Any
) -> Any:
    """The finding's base recipe at CPU scale, from its warm start (shared by the findings that share a base
    and a warm-start size, and reused on resume), smoke-sized under ``--smoke``."""
    if uses_main_warm_start(finding, run):
        main = run["main_warm_start"]
        recipe = search_r1_grpo(
            dataset=job.dataset, retriever=context["served_retriever"], scale="cpu", model=main["model"]
        )
        recipe.env_config.update(protocol=main["protocol"], topk=main["topk"])
        return job.smoke_sized(recipe.rollouts(max_turn_tokens=main["max_turn_tokens"]))
    if finding.base == "r_search":
        recipe = r_search_grpo(
            dataset=job.dataset,
            retriever=context["served_retriever"],
            judge=context["judge"],
            scale="cpu",
            model=args.model,
        )
    else:
        recipe = search_r1_grpo(
            dataset=job.dataset, retriever=context["served_retriever"], scale="cpu", model=args.model
        )
    steps = run["weak_warm_start_steps"] if finding.warm_start == "weak" else run["warm_start_steps"]
    return job.prepared(
        recipe,
        steps=steps,
        directory=f"warm_start_{finding.base}_{steps}_steps",
        always=True,
        reuse=not args.fresh,
    )


def retriever_specs(job: RecipeJob) -> dict[str, dict[str, Any]]:
    """In-process specs of the world's BM25, dense (MiniLM, Flat) and random-passage indexes, built once
    beside the world (all three arms go through the same in-process path)."""
    from rllib_search.serve.retrieval.build import build_index

    root = job.world.root
    specs = {"bm25": {"type": "index", "dir": str(job.world.index)}}
    for name, kind, options in (("dense", "flat", {"encoder": MINILM}), ("random", "random", {})):
        index = root / f"{kind}_index" if name == "random" else root / "flat_minilm_index"
        if not (index / "manifest.json").exists():
            job.say(f"building the {name} index of the world's passages in {index}")
            build_index(job.world.corpus, index, kind=kind, progress=False, **options)
        specs[name] = {"type": "index", "dir": str(index)}
    return specs


def run_arm(
    job: RecipeJob,
    finding: study.Finding,
    arm: study.Arm,
    config: Any,
    seeds: Any,
    args: Any,
    max_turn_tokens: int,
) -> Any:
    from ray import tune

    job.say(f"{finding.key}: arm {arm.name!r} ({arm.algorithm}, {max_turn_tokens} tokens a turn)")
    return fit_or_restore(
        study.trainable(arm),
        config.debugging(seed=tune.grid_search(list(seeds))),
        storage=job.out / "tune",
        name=study.experiment_name(finding, arm, max_turn_tokens),
        iterations=job.iterations,
        fresh=args.fresh,
        max_concurrent=trials_at_once(finding, args.max_concurrent),
        say=job.say,
        what=f"arm {arm.name!r}",
        keep_checkpoints=False,  # 14 arms x 3 seeds x ~1.6 GB would not fit; results are all the report reads
    )


def trials_at_once(finding: study.Finding, asked: int | None) -> int | None:
    """How many of an arm's trials run at once: ``asked``, else one a CPU (None), but one for a finding
    that serves a judge: two SmolLM2 trials and the judge's replica overflow 24 GB, and on two cores two
    trials take as long as one after the other."""
    if asked is not None:
        return asked
    return 1 if "judge" in finding.needs else None


def carried_over(json_path: Path, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The findings an earlier run (on this machine or another: the study spans sessions, and its Tune
    results under ``--out`` do not travel) analysed in ``json_path`` with the same run settings: finding key
    -> its analysis, with the turn budget it was measured at. A file from other settings, or none, carries
    nothing over."""
    if not json_path.exists():
        return {}
    earlier = json.loads(json_path.read_text())
    if not study.same_run_settings(earlier.get("run", {}), run):
        return {}
    return {
        finding.key: {**analysis, "max_turn_tokens": study.measured_turn_budget(finding, analysis)}
        for finding in study.FINDINGS
        if (analysis := earlier.get("findings", {}).get(finding.key, {})).get("status")
        in ("run", "partly run")
    }


def reusable_trials(
    finding: study.Finding,
    carried: dict[str, dict[str, Any]],
    run: dict[str, Any],
    warm_start: list[dict[str, Any]] | None,
) -> dict[str, list[dict[str, Any]]]:
    """Arm name -> trials of ``finding`` that an earlier run recorded (``carried``, same run settings) and
    that this run may analyse with its own: measured at this run's turn budget (and judge), from a warm
    start that answered the held-out questions as this run's did (``warm_start``; None: not evaluated
    here, e.g. a report rewritten on another machine)."""
    analysis = carried.get(finding.key)
    if not analysis or not measured_as_this_run(finding, analysis, run):
        return {}
    earlier = analysis.get("warm_start_eval", {}).get("answers")
    if warm_start is not None and earlier is not None and earlier != warm_start:
        return {}
    return study.carried_trials(analysis)


def arms_run(analysis: dict[str, Any] | None) -> int:
    """How many of a finding's arms an analysis has results of."""
    return sum(arm.get("status") == "run" for arm in (analysis or {}).get("arms", {}).values())


def write_report(out: Path, markdown: Path, json_path: Path, say: Any) -> None:
    """The report from every arm's experiment found under ``out``/tune at the run's turn budgets, and from
    the findings an earlier run wrote to ``json_path`` with the same settings that have no results under
    ``out``."""
    run_file = out / "run.json"
    if run_file.exists():
        run = json.loads(run_file.read_text())
    else:  # nothing ran here yet: rewrite what the earlier run wrote
        run = json.loads(json_path.read_text()).get("run", {}) if json_path.exists() else {}
    results = carried_over(json_path, run) if run else {}
    budgets = run.get("max_turn_tokens", study.EARLIER_TURN_BUDGETS)
    for finding in study.FINDINGS:
        budget = budgets[finding.base]
        trials = analysed_experiments(out, finding, budget)
        for records in trials.values():  # where the arms under ``out`` ran
            for record in records:
                record.setdefault("machine", run.get("machine"))
        warm_start = warm_start_answers(out, finding, budget)
        earlier = results.get(finding.key, {})
        if trials and run:  # arms trained elsewhere, from the same warm start, are analysed with these
            trials = {**reusable_trials(finding, results, run, warm_start), **trials}
        if trials and len(trials) >= arms_run(results.get(finding.key)):
            warm_start = warm_start or earlier.get("warm_start_eval", {}).get("answers")
            analysis = {**study.analyse(finding, trials, warm_start), "max_turn_tokens": budget}
            if "machine" in run:  # where the arms under ``out`` ran (runs before this recorded none)
                analysis["machine"] = run["machine"]
            if "judge" in finding.needs and "judge" in run:
                analysis["judge"] = run["judge"]
            results[finding.key] = analysis
    study.report(run, results, markdown, json_path)
    say(f"wrote {markdown} and {json_path}")


if __name__ == "__main__":
    sys.exit(main())
