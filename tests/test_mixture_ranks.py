"""data=mix in the ranks: the blend by trained tokens (`qwen3exp.data.mixture`), and real runs whose
ranks count each source's trained tokens (summary.json's `data_tokens`): the realised shares follow
the weights on 1 and on 2 ranks, a one-source mixture trains exactly as that source alone, and a
mixed run stopped after a checkpoint resumes with the same samples (losses and counts) as an
uninterrupted one."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from conftest import compose, read_metrics, read_summary, run_cli
from qwen3exp.data.mixture import Blend, allotment, pick, shares
from runprocs import TINY

WEIGHTS = {"web": 0.6, "team": 0.3, "notes": 0.1}


# --- the blend, plain Python -----------------------------------------------------------------------


def _tokens(source: int, k: int) -> int:
    """The trained tokens of source's k-th sample: 1..64, a function of (source, k) only (source 1's
    fewer, as conversations train only their assistant turns)."""
    return 1 + (source * 7919 + k * 104729) % (20 if source == 1 else 64)


def _draws(weights: list[float], n: int, blend: Blend | None = None) -> tuple[Blend, list[int]]:
    """`n` more samples drawn by the blend."""
    blend = blend or Blend(weights=weights)
    picked = []
    for _ in range(n):
        i = blend.next()
        assert i is not None
        blend.add(i, _tokens(i, blend.draws[i]))
        picked.append(i)
    return blend, picked


def test_shares_track_the_weights_within_one_sample_at_every_point():
    weights, rng = [0.6, 0.3, 0.1], random.Random(1)
    blend = Blend(weights=weights)
    for _ in range(500):
        i = blend.next()
        assert i is not None
        blend.add(i, rng.randint(1, 64))
        total = sum(blend.tokens)
        # No source lags its share by more than one sample, nor leads it by more than one sample.
        assert all(abs(w * total - t) <= 64 for w, t in zip(weights, blend.tokens, strict=True)), blend
    assert [round(s, 2) for s in shares(blend.tokens)] == [0.6, 0.3, 0.1]


def test_the_blend_is_deterministic_and_resumes_exactly():
    weights = [0.5, 0.3, 0.2]
    whole, picked = _draws(weights, 300)
    assert _draws(weights, 300)[1] == picked
    first, head = _draws(weights, 100)
    resumed = Blend(weights=weights)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # plain data, as a checkpoint keeps it
    after, tail = _draws(weights, 200, blend=resumed)
    assert head + tail == picked and after == whole


def test_a_weight_of_zero_is_never_drawn_and_ties_go_to_the_first_source():
    assert pick([0.5, 0.5], [0, 0], [True, True]) == 0
    assert pick([0.0, 1.0], [0, 0], [True, True]) == 1
    blend, picked = _draws([0.0, 0.7, 0.3], 200)
    assert 0 not in picked and blend.tokens[0] == 0


def test_a_capped_source_stops_and_the_others_fill_its_place_by_their_weights():
    blend, _ = _draws([0.6, 0.3, 0.1], 100)
    capped_at = blend.tokens[0]
    blend.cap(0)
    blend, picked = _draws([0.6, 0.3, 0.1], 600, blend=blend)
    assert blend.tokens[0] == capped_at and 0 not in picked
    assert abs(blend.tokens[1] / blend.tokens[2] - 3) < 0.2  # 0.3 : 0.1
    blend.cap(1)
    blend.cap(2)
    assert blend.next() is None  # nothing left to draw: the data ends


def test_allotment_caps_a_source_at_its_limit_and_shares_the_rest_by_weight():
    assert allotment([0.6, 0.3, 0.1], 1000, [None, None, None]) == pytest.approx([600, 300, 100])
    assert allotment([0.6, 0.3, 0.1], 1000, [None, 100, None]) == pytest.approx([900 * 6 / 7, 100, 900 / 7])
    assert allotment([0.5, 0.5], 1000, [100, 200]) == pytest.approx([100, 200])  # both exhausted
    assert allotment([0.0, 1.0], 1000, [None, None]) == pytest.approx([0, 1000])


# --- real runs ---------------------------------------------------------------------------------------

RUN = (
    "platform=cpu",
    "platform.threads_per_rank=1",
    "training.seq_len=64",
    "training.local_batch_size=8",
    "training.warmup_steps=2",
    "validation.enable=false",
    "metrics.tensorboard=false",
)


def _conf(root: Path) -> Path:
    """A user conf/ with data=mix3 (the bundled corpus, the bundled conversations and a small local
    JSON-lines file at 0.6 / 0.3 / 0.1) and data=mix1 (the bundled corpus alone)."""
    notes = root / "notes.jsonl"
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    notes.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=60))}) + "\n" for _ in range(40)))
    data = root / "conf" / "data"
    data.mkdir(parents=True)
    (data / "mix3.yaml").write_text(
        "source: mix\nsources:\n"
        f"  web: {{source: bundled, weight: {WEIGHTS['web']}}}\n"
        f"  team: {{source: chat, weight: {WEIGHTS['team']}}}\n"
        f"  notes: {{source: local, path: {notes}, weight: {WEIGHTS['notes']}}}\n"
    )
    (data / "mix1.yaml").write_text("source: mix\nsources:\n  web: {source: bundled, weight: 1}\n")
    return root / "conf"


def _mixed(conf: Path, run_dir: Path, *args: str) -> dict:
    r = run_cli("--config-dir", str(conf), *args, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return read_summary(run_dir)


def _assert_shares(summary: dict) -> None:
    tokens = summary["data_tokens"]
    total = sum(tokens.values())
    assert total > 0 and set(tokens) == set(WEIGHTS)
    assert all(abs(tokens[s] / total - w) <= 0.02 for s, w in WEIGHTS.items()), {
        s: t / total for s, t in tokens.items()
    }


@pytest.fixture(scope="module")
def conf(tmp_path_factory) -> Path:
    return _conf(tmp_path_factory.mktemp("mix"))


@pytest.fixture(scope="module")
def two_ranks(conf, tmp_path_factory) -> Path:
    """16 steps x 2 ranks x 8 sequences (256 samples) of data=mix3, a dcp checkpoint every 4 steps."""
    run = tmp_path_factory.mktemp("two") / "run"
    _mixed(conf, run, "data=mix3", *RUN, "training.steps=16", "launcher.nproc_per_node=2", "checkpoint=dcp",
           "checkpoint.interval=4", "checkpoint.keep_latest_k=0")  # fmt: skip
    return run


@pytest.mark.slow  # trains: 16 steps on 2 CPU ranks (the module's shared run)
def test_the_realised_shares_follow_the_weights_on_two_ranks(two_ranks):
    s = read_summary(two_ranks)
    assert s["status"] == "completed" and s["steps_completed"] == 16
    _assert_shares(s)
    # The counts are every data-parallel rank's, summed: one file per rank.
    assert sorted(p.name for p in (two_ranks / "logs" / "data_tokens").iterdir()) == ["rank0.json", "rank1.json"]


@pytest.mark.slow  # trains: 32 steps on 1 CPU rank
def test_the_realised_shares_follow_the_weights_on_one_rank(conf, tmp_path):
    s = _mixed(conf, tmp_path / "run", "data=mix3", *RUN, "training.steps=32", "launcher.nproc_per_node=1")
    assert s["world_size"] == 1 and s["steps_completed"] == 32  # 256 samples
    _assert_shares(s)


@pytest.mark.slow  # trains: resumes the shared 2-rank run from its step-8 checkpoint
def test_a_mixed_run_stopped_after_a_checkpoint_resumes_with_the_same_samples(two_ranks, conf, tmp_path):
    # The run directory as a run stopped right after its step-8 checkpoint leaves it: the later
    # checkpoints, the counts and the summary gone (the metrics rows after step 8 are dropped by the
    # resume itself). Relaunched with the same command, it must train steps 9-16 on the same samples
    # as the uninterrupted run: the same losses, bit for bit, and the same tokens per source.
    stopped = tmp_path / "stopped"
    shutil.copytree(two_ranks, stopped)
    for step in (12, 16):
        shutil.rmtree(stopped / "checkpoint" / f"step-{step}")
    shutil.rmtree(stopped / "logs" / "data_tokens")
    (stopped / "summary.json").unlink()
    s = _mixed(conf, stopped, "data=mix3", *RUN, "training.steps=16", "launcher.nproc_per_node=2", "checkpoint=dcp",
               "checkpoint.interval=4", "checkpoint.keep_latest_k=0")  # fmt: skip
    assert s["resumed_from_step"] == 8
    expected = {r["step"]: r["loss"] for r in read_metrics(two_ranks)}
    assert {r["step"]: r["loss"] for r in read_metrics(stopped)} == expected
    assert s["data_tokens"] == read_summary(two_ranks)["data_tokens"]


@pytest.mark.slow  # trains: runprocs.TINY on 2 ranks, compared with the shared reference run
def test_a_one_source_mixture_trains_exactly_as_that_source_alone(conf, tmp_path, reference_losses):
    run = tmp_path / "run"
    s = _mixed(conf, run, "data=mix1", *TINY, "launcher.nproc_per_node=2")
    assert [r["loss"] for r in read_metrics(run)] == reference_losses
    assert set(s["data_tokens"]) == {"web"} and s["data_tokens"]["web"] == 6 * 2 * 2 * 64  # steps x ranks x batch x seq


@pytest.mark.slow  # imports torchtitan and renders pairs with the bundled tokenizer (no training)
def test_a_mixture_of_pair_sets_draws_whole_pairs(tmp_path):
    from qwen3exp.assets import ASSETS, TOKENIZER_DIR
    from qwen3exp.titan.mixture_dataset import MixtureDataLoader, MixtureDataset, SourceSpec
    from qwen3exp.titan.preference_dataset import PreferenceDataLoader

    pairs = ASSETS / "preference" / "train.jsonl"
    four = tmp_path / "four.jsonl"  # source b: 4 pairs, capped after one epoch
    four.write_text("".join(pairs.read_text().splitlines(keepends=True)[:4]))
    specs = [
        SourceSpec(
            name=n,
            weight=w,
            max_epochs=cap,
            loader=PreferenceDataLoader.Config(path=str(p), tokenizer_path=str(TOKENIZER_DIR)),
        )
        for n, w, p, cap in (("a", 0.7, pairs, None), ("b", 0.3, four, 1.0))
    ]
    config = MixtureDataLoader.Config(sources=specs, record_dir=str(tmp_path), record_every=8)
    ds = MixtureDataset(config, tokenizer=None, seq_len=192, dp_rank=0, dp_world_size=1)
    rows = [x for _, x in zip(range(80), ds, strict=False)]
    for (chosen, chosen_labels), (rejected, _) in zip(rows[::2], rows[1::2], strict=True):
        # Rows 2i and 2i + 1 are one pair's sides: the same prompt up to the first trained token.
        answer = int((chosen_labels != -100).nonzero()[0])
        assert chosen["input"][:answer].tolist() == rejected["input"][:answer].tolist()
        assert not chosen["input"].equal(rejected["input"])
    # b is read once (its 4 pairs) and then capped: a fills its place.
    assert ds.blend.draws == [36, 4] and ds.blend.capped == [False, True]
    record = json.loads((tmp_path / "logs" / "data_tokens" / "rank0.json").read_text())
    assert record == {"dp_rank": 0, "tokens": ds.tokens()}  # written after every 8th row: the 80th


def test_the_text_sources_separator_configures_the_tokenizer():
    # One tokenizer appends one eos_id to every text document (different ones are refused before
    # launch: tests/test_mixture_plan.py).
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.config.sections.mixture import MixedBundled, MixtureData
    from qwen3exp.titan.mixture_config import _text_source

    exp = validate_experiment(compose())
    same = MixtureData(sources={"a": MixedBundled(), "b": MixedBundled(weight=2)})
    assert _text_source(exp.model_copy(update={"data": same})).data == MixedBundled()
