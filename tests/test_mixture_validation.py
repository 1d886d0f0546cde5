"""data=mix: validation per source (issue 41), its metrics, the report, and the sweep objective.

Fast (in-process, no training):
- the mixture's validator weighs each source by its trained tokens: on fake batches, `val_loss` is the
  summed loss of every source over their summed tokens (-100 labels left out), `val_loss_<source>`
  each source's own mean, over validation.steps batches per source; a mixture of preference pair
  sets (DPO, with its reference) measures each source as the one-source PreferenceValidator does;
- the validation row of metrics.jsonl, the console's validation line, TensorBoard's hparams metrics,
  summary.json's fields and the objective's value carry `val_loss_<source>`;
- `sweep.objective=val_loss_<source>` is accepted for a source of data.sources (minimized); a name
  that is no source exits 2 naming the key, the value and the sources allowed; pipeline stages
  with a mixture's validation are refused (it runs the model whole);
- `qwen3exp report` shows each run's normalised weight next to its validation loss of each source
  (and `report A B` compares the sources' losses), and a run without a mixture shows no such column.

Slow (the real command line, tiny model, CPU, 2 ranks):
- a sweep over one source's weight (`-m data.sources.corpus.weight=0.2,0.8`, 2 steps, an HF export
  each): each job's final `val_loss_<source>` equals the loss transformers computes with its exported
  weights on that source's held-out sequences (the same sequences, the same -100 labels, each
  document on its own as the ranks' block-causal attention sees it), to 1e-4, and so does `val_loss`
  (their token-weighted mean); the conversations' held-out sequences are also rebuilt without the
  ranks' loaders (data=chat's split, rendered, padded) and are the same; `qwen3exp report` shows
  each job's weights next to its per-source losses;
- an Optuna search over a raw weight (2 trials, objective val_loss_chats) completes, each trial
  returning its val_loss_chats.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import read_summary, read_validation, run_cli
from hf_fixtures import in_fresh_process
from qwen3exp.config.schema import check_experiment

SOURCES = {"corpus": {"source": "bundled", "weight": 0.7}, "chats": {"source": "chat", "weight": 0.3}}
MIX_CONF = {
    "experiment/mixv.yaml": (
        "# @package _global_\n"
        "defaults:\n  - override /model: native\n  - override /platform: auto\n  - override /data: mix\n\n"
        "name: mixv\n"
        "data:\n  sources:\n"
        "    corpus: {source: bundled, weight: 0.7}\n"
        "    chats: {source: chat, weight: 0.3}\n"
        "training: {steps: 4, seq_len: 192, local_batch_size: 4, lr: 3.0e-3, warmup_steps: 1}\n"
        "validation: {freq: 2, steps: 1}\n"
        "metrics: {tensorboard: false}\n"
    ),
    "experiment/mixv_search.yaml": (
        "# @package _global_\n"
        "defaults:\n  - mixv\n  - override /hydra/sweeper: optuna\n  - override /hydra/sweeper/sampler: tpe\n\n"
        "name: mixv_search\n"
        "sweep: {objective: val_loss_chats}\n"
        "hydra:\n  sweeper:\n    direction: minimize\n    n_trials: 2\n    n_jobs: 1\n"
        "    study_name: ${name}\n    storage: sqlite:///${hydra.sweep.dir}/optuna.db\n"
        "    sampler: {seed: 0}\n"
        "    params:\n      data.sources.corpus.weight: interval(0.1, 0.9)\n"
    ),
}
"""A test-local conf/ (--config-dir): a two-source experiment on the packaged data=mix (the bundled corpus and the
bundled conversations) and an Optuna search over the corpus's raw weight (the chats' stays 0.3)."""


def mix_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    for name, body in MIX_CONF.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(body)
    return conf


# ------------------------------------------------------------------ fast: the validator's sums
@dataclass(kw_only=True)
class FakeLoader:
    """A dataloader config whose `build` yields fixed (inputs, labels) batches."""

    batches: list
    infinite: bool = True

    def build(self, **_kwargs):
        return iter(self.batches)


def _batches(seed: int, n: int, masked: int, rows: int = 2):
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 11, (rows, 6), generator=g)
        labels = torch.randint(0, 11, (rows, 6), generator=g)
        labels[:, :masked] = -100
        out.append(({"input": ids}, labels))
    return out


def _ce_sum(pred, y):
    import torch.nn.functional as F

    return F.cross_entropy(pred.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")


def _validator(cls, config, loss_fn, logged: list):
    """A validator of `cls` with fakes for what the trainer hands it (one rank, no parallelism)."""
    return cls(
        config,
        parallelism=SimpleNamespace(spmd_backend="spmd_types"),
        dp_world_size=1,
        dp_rank=0,
        tokenizer=None,
        parallel_dims=SimpleNamespace(dp_enabled=False, dp_cp_enabled=False, cp_enabled=False, pp_enabled=False),
        loss_fn=loss_fn,
        validation_context=contextlib.nullcontext,
        metrics_processor=SimpleNamespace(ntokens_since_last_log=0, log_validation=lambda **kw: logged.append(kw)),
        seq_len=6,
        local_batch_size=2,
    )


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))


def test_the_mixture_validator_weighs_each_source_by_its_trained_tokens(monkeypatch):
    import torch
    from torchtitan.tools import utils

    monkeypatch.setattr(utils, "device_type", "cpu")  # the ranks' platform sets it; here no accelerator

    from qwen3exp.titan.metrics import SOURCE_LOSS_PREFIX
    from qwen3exp.titan.mixture_validator import MixtureValidator

    model = _model(0)
    sources = {"web": _batches(1, 3, masked=1), "code": _batches(2, 3, masked=4)}
    logged: list = []
    loaders = {n: FakeLoader(batches=b) for n, b in sources.items()}
    config = MixtureValidator.Config(enable=True, steps=2, dataloader=FakeLoader(batches=[]), sources=loaders)
    validator = _validator(MixtureValidator, config, lambda pred, y: (_ce_sum(pred, y), {}), logged)
    validator.validate([model], step=3)
    sums, counts = {}, {}
    with torch.no_grad():
        for name, batches in sources.items():
            xs, ys = torch.cat([b[0]["input"] for b in batches[:2]]), torch.cat([b[1] for b in batches[:2]])
            sums[name] = _ce_sum(model(xs), ys).item()
            counts[name] = int((ys != -100).sum())
    (row,) = logged
    assert row["step"] == 3 and model.training
    assert counts == {"web": 20, "code": 8}  # 2 batches x 2 rows x (6 - masked) trained labels
    for name in sources:
        assert math.isclose(row["extra_metrics"][SOURCE_LOSS_PREFIX + name], sums[name] / counts[name], rel_tol=1e-6)
    assert math.isclose(row["loss"], sum(sums.values()) / sum(counts.values()), rel_tol=1e-6)
    assert validator.metrics_processor.ntokens_since_last_log == 2 * 2 * 2 * 6  # every position, as torchtitan


def test_a_mixture_of_pair_sets_is_validated_as_each_set_alone(monkeypatch):
    """objective=dpo (a reference): each source's loss is what PreferenceValidator measures on that
    source alone; val_loss and val_reward_accuracy are over every source's pairs (equal counts here)."""
    from torchtitan.tools import utils

    monkeypatch.setattr(utils, "device_type", "cpu")

    from qwen3exp.config.sections.objective import DpoObjective
    from qwen3exp.objectives import registry
    from qwen3exp.titan.metrics import SOURCE_LOSS_PREFIX, VAL_REWARD_ACCURACY
    from qwen3exp.titan.mixture_validator import MixturePairValidator
    from qwen3exp.titan.preference_loss import row_logps
    from qwen3exp.titan.preference_validator import PreferenceValidator

    model, reference = _model(0), _model(1)
    section = DpoObjective()
    loss_fn = SimpleNamespace(module=registry.of(section), section=section)
    sources = {"team": _batches(5, 2, masked=2, rows=4), "base": _batches(6, 2, masked=3, rows=4)}

    def validated(cls, **config) -> dict:
        logged: list = []
        v = _validator(cls, cls.Config(enable=True, steps=2, **config), loss_fn, logged)
        v.reference = lambda inputs, labels, extra, *_: row_logps(reference(inputs), labels)[0]
        v.validate([model], step=2)
        return logged[0]

    alone = {n: validated(PreferenceValidator, dataloader=FakeLoader(batches=b)) for n, b in sources.items()}
    loaders = {n: FakeLoader(batches=b) for n, b in sources.items()}
    mixed = validated(MixturePairValidator, dataloader=FakeLoader(batches=[]), sources=loaders)
    for name, row in alone.items():
        assert math.isclose(mixed["extra_metrics"][SOURCE_LOSS_PREFIX + name], row["loss"], rel_tol=1e-6)
    assert math.isclose(mixed["loss"], (alone["team"]["loss"] + alone["base"]["loss"]) / 2, rel_tol=1e-6)
    accuracy = [row["extra_metrics"][VAL_REWARD_ACCURACY] for row in alone.values()]
    assert math.isclose(mixed["extra_metrics"][VAL_REWARD_ACCURACY], sum(accuracy) / 2, rel_tol=1e-6)


# ------------------------------------------------------- fast: the row, the console, the summary
def test_the_validation_row_the_console_and_the_summary_carry_each_source(tmp_path):
    from qwen3exp.run import metrics_file, objective
    from qwen3exp.run.progress import Progress
    from qwen3exp.titan.metrics import SOURCE_LOSS_PREFIX, JsonlLogger
    from qwen3exp.titan.trackers import TensorBoardTracker

    log = JsonlLogger(str(tmp_path / "metrics.jsonl"), peak_flops_known=False)
    log.log({"validation_metrics/loss": 2.5, SOURCE_LOSS_PREFIX + "web": 2.0, SOURCE_LOSS_PREFIX + "code": 3.0}, 4)
    log.close()
    (row,) = metrics_file.read_validation(tmp_path)
    assert row["val_loss"] == 2.5 and row["val_loss_web"] == 2.0 and row["val_loss_code"] == 3.0
    said: list[str] = []
    Progress(tmp_path / "absent.jsonl", 10, lambda line, _live: said.append(line)).show(row)
    assert said == ["qwen3exp: validation at step 4: loss 2.5000, perplexity 12.2, web 2.0000, code 3.0000"]
    tb = TensorBoardTracker(str(tmp_path / "tb"), {}, None)
    tb.log({"validation_metrics/loss": 2.5, SOURCE_LOSS_PREFIX + "web": 2.0}, 4)
    assert tb._last == {"hparam/val_loss": (2.5, 4), "hparam/val_loss_web": (2.0, 4)}
    tb.close()
    extras = metrics_file.validation_extras(row)
    assert extras == {"val_loss_web": 2.0, "val_loss_code": 3.0}
    value = objective.value_of("val_loss_code", last_loss=1.0, val_loss=2.5, tokens_per_second=1.0, validation=extras)
    assert value == 3.0
    assert objective.value_of("val_loss", last_loss=1.0, val_loss=2.5, tokens_per_second=1.0, validation=extras) == 2.5


# ------------------------------------------------------------------ fast: sweep.objective
def _mix(**sections) -> dict:
    return {"name": "m", "model": {"backend": "native"}, "data": {"source": "mix", "sources": SOURCES}, **sections}


def test_a_source_loss_is_an_objective_of_a_mixture():
    checked = check_experiment(_mix(sweep={"objective": "val_loss_chats"}))
    assert checked.problems == [] and checked.exp is not None
    assert checked.exp.sweep_target == ("val_loss_chats", "minimize")
    off = check_experiment(_mix(sweep={"objective": "val_loss_chats"}, validation={"enable": False}))
    assert [(p.key, p.value) for p in off.problems] == [("sweep.objective", "val_loss_chats")]
    up = check_experiment(_mix(sweep={"objective": "val_loss_chats", "direction": "maximize"}))
    assert [p.key for p in up.problems] == ["sweep.direction"]
    staged = check_experiment(_mix(parallelism={"pp": 2}))  # the validator runs the model whole
    assert any(p.key == "parallelism.pp" and "mixture's validation" in p.message for p in staged.problems)
    assert not any(
        "mixture" in p.message
        for p in check_experiment(_mix(parallelism={"pp": 2}) | {"validation": {"enable": False}}).problems
    )


def test_a_source_objective_that_names_no_source_exits_2(tmp_path):
    conf = mix_conf(tmp_path)
    r = run_cli("--config-dir", str(conf), "experiment=mixv", "sweep.objective=val_loss_web", "dry_run=true")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert "sweep.objective" in r.stderr and "val_loss_web" in r.stderr and "names no source" in r.stderr
    assert "val_loss_corpus" in r.stderr and "val_loss_chats" in r.stderr, r.stderr
    one = check_experiment({"name": "m", "model": {"backend": "native"}, "sweep": {"objective": "val_loss_corpus"}})
    ((key, value, message, allowed),) = [(p.key, p.value, p.message, p.allowed) for p in one.problems]
    assert (
        (key, value) == ("sweep.objective", "val_loss_corpus") and "data=bundled" in message and "data=mix" in allowed
    )


# ------------------------------------------------------------------------ fast: the report
def _recorded_run(folder: Path, weights: dict | None, val: dict) -> None:
    folder.mkdir(parents=True)
    data = {"source": "bundled"}
    if weights is not None:
        data = {"source": "mix", "sources": {n: {"source": "bundled", "weight": w} for n, w in weights.items()}}
    (folder / "experiment.yaml").write_text(yaml.safe_dump({"name": "m", "data": data}, sort_keys=False))
    rows = [{"step": 2, "loss": 3.0}, {"step": 2, "val_loss": 3.1, "val_perplexity": 22.2, **val}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "completed", "steps_completed": 2, "last_loss": 3.0, "val_loss": 3.1, **val}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_report_shows_each_sources_weight_next_to_its_loss(tmp_path):
    from qwen3exp.analysis.compare import compare, render_comparison
    from qwen3exp.analysis.report_table import render_terminal, table
    from qwen3exp.analysis.runs import load_run

    _recorded_run(tmp_path / "a", {"web": 1.0, "code": 3.0}, {"val_loss_web": 2.25, "val_loss_code": 4.5})
    _recorded_run(tmp_path / "b", {"web": 1.0, "code": 1.0}, {"val_loss_web": 2.5, "val_loss_code": 4.0})
    _recorded_run(tmp_path / "c", None, {})
    t = table([load_run(tmp_path / n) for n in "abc"], root=tmp_path)
    cols = ["weight web", "val loss web", "weight code", "val loss code"]
    at = t.header.index("weight web")
    assert t.header[at : at + 4] == cols and t.header[at + 4 :][:1] == ["status"]
    by_run = {row[0]: row[at : at + 4] for row in t.rows}
    assert by_run == {"a": [0.25, 2.25, 0.75, 4.5], "b": [0.5, 2.5, 0.5, 4.0], "c": [None, None, None, None]}
    shown = render_terminal(t).splitlines()
    assert "  weight web  val loss web  weight code  val loss code  status" in shown[0], shown
    assert "  0.250        2.2500        0.750         4.5000  completed" in shown[2], shown
    pair = render_comparison(compare(load_run(tmp_path / "a"), load_run(tmp_path / "b")))  # report A B
    after = "  val loss       3.1000  3.1000  +0.0000  1.000x\n  val loss web   2.2500  2.5000  +0.2500  1.111x\n"
    assert after in pair, pair
    assert "  val loss code  4.5000  4.0000  -0.5000  0.889x\n" in pair, pair
    plain = table([load_run(tmp_path / "c")], root=tmp_path)
    assert not any(h.startswith(("weight ", "val loss ")) for h in plain.header)


# ------------------------------------------- slow: per-source val_loss == transformers on the export
def held_out_segments(run_dir: Path, ranks: int) -> dict[str, tuple[list, list]]:
    """Each source's held-out sequences as the ranks' validator read them (its kind's validation loader
    for each data-parallel rank, validation.steps batches of training.local_batch_size), cut into
    their documents (a sequence's positions restart at 0 where one starts: the ranks' attention is
    block-causal over them), each padded at its end with -100 labels: (inputs, labels) per source."""
    from qwen3exp.config.schema import parse_experiment
    from qwen3exp.titan import dataset
    from qwen3exp.titan.job_config import data_path, hf_assets_path
    from qwen3exp.titan.mixture_validator import source_loaders, source_view

    exp = parse_experiment(yaml.safe_load((run_dir / "experiment.yaml").read_text()))
    folder, t = str(hf_assets_path(exp)), exp.training
    text = next(n for n, s in exp.data.sources.items() if s.source in ("bundled", "local", "hf"))
    tokenizer = dataset.tokenizer_config(source_view(exp, text), folder).build(tokenizer_path=folder)
    out: dict[str, tuple[list, list]] = {}
    for name, loader in source_loaders(exp, folder, data_path).items():
        inputs, labels = [], []
        for rank in range(ranks):
            built = loader.build(
                dp_world_size=ranks,
                dp_rank=rank,
                tokenizer=tokenizer,
                seq_len=t.seq_len,
                local_batch_size=t.local_batch_size,
            )
            for _, (x, y) in zip(range(exp.validation.steps), built, strict=False):
                for ids, pos, lab in zip(x["input"].tolist(), x["positions"].tolist(), y.tolist(), strict=True):
                    starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
                    for a, b in zip(starts, starts[1:], strict=False):
                        assert pos[a:b] == list(range(b - a)), (name, pos[a:b])
                        pad = t.seq_len - (b - a)
                        inputs.append(ids[a:b] + [0] * pad)
                        labels.append(lab[a:b] + [-100] * pad)
        out[name] = (inputs, labels)
    return out


def held_out_chats(run_dir: Path, ranks: int, per_rank: int) -> tuple[list, list]:
    """The bundled conversations' held-out side rebuilt without the ranks' loaders: round(n x 0.1) of
    them by `held_out` (data=chat's split), rank r reading held-out conversations r, r + ranks, ...,
    each rendered by the chat template, padded, labels -100 except the assistant's tokens."""
    from qwen3exp.assets import TOKENIZER_DIR
    from qwen3exp.data.chat.render import load_tokenizer, messages_of, records, render
    from qwen3exp.data.files import held_out

    tok, seq_len = load_tokenizer(TOKENIZER_DIR), 192
    lines = [line for _, _, line in records(TOKENIZER_DIR.parent / "chat")]
    held = [lines[i] for i in sorted(held_out(len(lines), 0.1))]
    inputs, labels = [], []
    for rank in range(ranks):
        for line in held[rank::ranks][:per_rank]:
            x = render(tok, messages_of(line))
            n = len(x.ids) - 1
            inputs.append(x.ids[:-1] + [tok.pad_token_id] * (seq_len - n))
            labels.append(
                [t if on else -100 for t, on in zip(x.ids[1:], x.trained[1:], strict=True)] + [-100] * (seq_len - n)
            )
    return inputs, labels


def references_here(jobs: list) -> list[dict]:
    """For each (export folder, segments of each source): transformers' loss sum and trained-token
    count of each source's segments (in a fresh process: `hf_fixtures.in_fresh_process`)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = []
    for folder, segments in jobs:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        sums = {}
        with torch.no_grad():
            for name, (inputs, labels) in segments.items():
                logits, y = model(input_ids=torch.tensor(inputs)).logits, torch.tensor(labels)
                sums[name] = [_ce_sum(logits, y).item(), int((y != -100).sum())]
        out.append(sums)
    return out


@pytest.fixture(scope="module")
def weight_sweep(tmp_path_factory) -> Path:
    """The sweep over the corpus's weight, 2 jobs of 2 steps on 2 ranks, each with a float32 export."""
    root = tmp_path_factory.mktemp("mix_sweep")
    d = root / "sweep"
    r = run_cli(
        "--config-dir", str(mix_conf(root)), "-m", "experiment=mixv", "data.sources.corpus.weight=0.2,0.8",
        "training.steps=2", "platform=cpu", "platform.threads_per_rank=1", "checkpoint=hf_export",
        "checkpoint.dtype=float32", f"hydra.sweep.dir={d}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d


def _jobs(d: Path) -> list[Path]:
    return sorted(p.parent for p in d.glob("*/summary.json"))


@pytest.mark.slow
def test_each_sources_val_loss_equals_transformers_on_the_export(weight_sweep):
    """Both jobs: the last validation (step 2) of each source, and their mean, against transformers on
    the export of step 2 (saved before that validation runs)."""
    worst = 0.0
    jobs = _jobs(weight_sweep)
    assert len(jobs) == 2
    refs = in_fresh_process(
        "test_mixture_validation.references_here",
        [(str(job / "export" / "step-2"), held_out_segments(job, 2)) for job in jobs],
    )
    assert held_out_segments(jobs[0], 2)["chats"] == held_out_chats(jobs[0], 2, 4)  # the kind's own split
    for job, ref in zip(jobs, refs, strict=True):
        summary, last = read_summary(job), read_validation(job)[-1]
        assert summary["status"] == "completed" and summary["world_size"] == 2 and last["step"] == 2
        for name, (loss_sum, count) in ref.items():
            assert count > 0 and summary[f"val_loss_{name}"] == last[f"val_loss_{name}"]
            worst = max(worst, abs(last[f"val_loss_{name}"] - loss_sum / count))
        mean = sum(s for s, _ in ref.values()) / sum(n for _, n in ref.values())
        worst = max(worst, abs(last["val_loss"] - mean))
    print(f"largest |val_loss(_<source>) - transformers|: {worst:.3g}")
    assert worst < 1e-4


@pytest.mark.slow
def test_the_report_of_a_weight_sweep_shows_weights_beside_source_losses(weight_sweep):
    r = run_cli(str(weight_sweep), "--format", "csv", "--no-files", module="qwen3exp.analysis.report")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(io.StringIO(r.stdout[r.stdout.index("run,") :])))
    header = list(rows[0])
    at = header.index("weight corpus")
    assert header[at : at + 4] == ["weight corpus", "val loss corpus", "weight chats", "val loss chats"]
    by_weight = {round(float(row["weight corpus"]), 3): row for row in rows}
    assert set(by_weight) == {round(0.2 / 0.5, 3), round(0.8 / 1.1, 3)}  # normalised: 0.2 / (0.2 + 0.3), ...
    for job in _jobs(weight_sweep):
        summary = read_summary(job)
        row = next(row for row in rows if row["run"] == job.name)
        assert float(row["val loss chats"]) == pytest.approx(summary["val_loss_chats"])
        assert float(row["val loss corpus"]) == pytest.approx(summary["val_loss_corpus"])


@pytest.mark.slow
def test_an_optuna_search_over_a_weight_completes(tmp_path):
    d = tmp_path / "search"
    r = run_cli(
        "--config-dir", str(mix_conf(tmp_path)), "-m", "experiment=mixv_search", "training.steps=2",
        "launcher.nproc_per_node=1", "platform=cpu", f"hydra.sweep.dir={d}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trials = _jobs(d)
    assert len(trials) == 2 and (d / "optuna.db").is_file()
    for trial in trials:
        summary = read_summary(trial)
        assert summary["status"] == "completed"
        assert summary["objective"] == {
            "metric": "val_loss_chats", "direction": "minimize", "value": summary["val_loss_chats"]
        }  # fmt: skip
        assert (
            0.1 <= yaml.safe_load((trial / "experiment.yaml").read_text())["data"]["sources"]["corpus"]["weight"] <= 0.9
        )
