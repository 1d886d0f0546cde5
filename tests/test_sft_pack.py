"""data=chat with data.pack=true: several conversations per sequence, none attending to another (issue 24).

- the first packed batch of a rank, token by token: each conversation where greedy packing puts it,
  positions from 0, exactly its assistant contents and end-of-turn tokens trained (system and user
  turns, role headers, the empty thinking block, padding not), the padding tail a document of its own;
- isolation: changing one conversation of a packed row leaves the tiny native model's logits of the
  other conversations of that row unchanged, and would change them without the document mask;
- real 2-rank trainings from a transformers checkpoint (native and hf backends): the step-1 loss
  equals transformers' loss on the same conversations, each run on its own, the same labels;
- the plan counts the sequences the conversations pack into, as the ranks pack them.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import compose, read_metrics, run_cli
from hf_fixtures import first_batches, masked_loss, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.render import Rendered, fit, load_tokenizer, messages_of, records, render
from qwen3exp.data.files import held_out
from test_sft import runs

SEQ = 192  # tiny_sft's seq_len: every bundled conversation fits (the longest is 167 tokens)
THINK = "<think>\n\n</think>\n\n"


def rank_conversations(rank: int, world: int, fraction: float | None, tok) -> list[tuple[list, Rendered]]:
    """(messages, rendered) of the bundled conversations data-parallel rank `rank` reads, in order:
    the training side of the held-out split (none without `fraction`), every `world`-th one."""
    lines = [line for _, _, line in records(TOKENIZER_DIR.parent / "chat")]
    held = set(held_out(len(lines), fraction)) if fraction is not None else set()
    mine = [messages_of(line).messages for i, line in enumerate(lines) if i not in held][rank::world]
    return [(m, r) for m, r in ((m, fit(render(tok, m), SEQ, "drop")) for m in mine) if r is not None]


def greedy(conversations: list, seq_len: int = SEQ) -> list[list]:
    """The conversations in order, a new row whenever the next one does not fit in what is left
    (written out here, independently of the dataset's packer)."""
    rows: list[list] = [[]]
    for c in conversations:
        n = len(c[1].ids) - 1
        if rows[-1] and sum(len(x[1].ids) - 1 for x in rows[-1]) + n > seq_len:
            rows.append([])
        rows[-1].append(c)
    return rows


def expected_runs(messages: list[dict]) -> list[tuple[bool, str]]:
    """The runs of untrained and trained label tokens of a conversation in Qwen3's format (the first
    token, `<|im_start|>`, is no label): headers, system and user turns untrained, each assistant
    content with its `<|im_end|>` trained, the empty thinking block of the last turn untrained."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    out, text = [], ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
            continue
        text += "<|im_start|>assistant\n" + (THINK if i == last else "")
        out += [(False, text), (True, m["content"] + "<|im_end|>")]
        text = "\n"
    out.append((False, text))
    return [(False, out[0][1].removeprefix("<|im_start|>")), *out[1:]]


def test_packed_first_batch_trains_exactly_the_assistant_tokens():
    """Data-parallel rank 1 of 2 of experiment=tiny_sft with data.pack=true: its first batch (4 rows)."""
    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan

    exp = validate_experiment(compose("experiment=tiny_sft", "data.pack=true", "training.local_batch_size=4"))
    loader = ChatDataLoader(
        loader_config(exp, str(TOKENIZER_DIR), validation=False), dp_world_size=2, dp_rank=1, seq_len=SEQ,
        local_batch_size=4,
    )  # fmt: skip
    inputs, labels = next(iter(loader))
    tok = load_tokenizer(TOKENIZER_DIR)
    rows = greedy(rank_conversations(1, 2, exp.validation.fraction, tok))
    seen = set()
    for row, packed in enumerate(rows[:4]):
        ids, y, pos = (t[row].tolist() for t in (inputs["input"], labels, inputs["positions"]))
        at = 0
        for messages, r in packed:
            n = len(r.ids) - 1
            assert pos[at : at + n] == list(range(n)) and ids[at : at + n] == r.ids[:-1]
            trained = [t != -100 for t in y[at : at + n]]
            assert [t for t, on in zip(y[at : at + n], trained, strict=True) if on] == [
                t for t, on in zip(r.ids[1:], trained, strict=True) if on
            ]
            assert runs(tok, r.ids[1:], trained) == expected_runs(messages)  # token by token
            seen |= {m["role"] for m in messages} | {len(messages)}
            at += n
        tail = SEQ - at
        assert tail < len(rows[row + 1][0][1].ids) - 1  # greedy: the next conversation did not fit
        assert ids[at:] == [tok.pad_token_id] * tail and y[at:] == [-100] * tail and pos[at:] == list(range(tail))
    assert max(len(packed) for packed in rows[:4]) >= 2, "rows of one conversation check no packing"
    assert {"system", "user", "assistant"} <= seen and max(s for s in seen if isinstance(s, int)) >= 5


def test_a_packed_conversation_cannot_see_its_neighbours():
    """The tiny native model (attention=sdpa, the CPU path) on a packed row of the real loader:
    changing the tokens of the row's second conversation leaves every other position's logits (the
    conversations before and after it, the padding) unchanged with the document mask torchtitan
    builds from the positions, and changes those after it without the mask."""
    import torch

    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan
    from qwen3exp.titan.job_config import resolve_arch  # lazy: the same
    from qwen3exp.titan.model import qwen3_model_config  # lazy: the same

    exp = validate_experiment(compose("experiment=tiny_sft", "data.pack=true", "validation.enable=false"))
    config = loader_config(exp, str(TOKENIZER_DIR), validation=False)
    inputs, _ = next(iter(ChatDataLoader(config, dp_world_size=1, dp_rank=0, seq_len=SEQ, local_batch_size=16)))
    row = max(range(16), key=lambda i: int((inputs["positions"][i] == 0).sum()))  # the most conversations
    ids, pos = inputs["input"][row : row + 1], inputs["positions"][row : row + 1]
    starts = (pos[0] == 0).nonzero().flatten().tolist()
    assert len(starts) >= 4, starts  # three conversations at least (and the padding, if any)
    lo, hi = starts[1], starts[2]
    changed = ids.clone()
    changed[0, lo:hi] = (ids[0, lo:hi] * 7 + 11) % 2048
    other = torch.ones(SEQ, dtype=torch.bool)
    other[lo:hi] = False
    torch.manual_seed(0)
    model = qwen3_model_config(resolve_arch(exp), attention="sdpa").build()
    with torch.no_grad():
        for p in model.parameters():  # large weights: the logits depend strongly on what is attended
            torch.nn.init.normal_(p, std=0.2) if p.dim() > 1 else torch.nn.init.uniform_(p, 0.5, 1.5)
        model.eval()
        masks = model.get_attention_masks(positions=pos)
        a, b = model(ids, positions=pos, attention_masks=masks), model(changed, positions=pos, attention_masks=masks)
        assert (a[0, lo:hi] - b[0, lo:hi]).abs().max() > 1e-2  # the changed conversation itself
        assert (a[0, other] - b[0, other]).abs().max() <= 1e-6
        unmasked = [model(x, positions=pos) for x in (ids, changed)]  # one causal row: no document mask
        assert (unmasked[0][0, hi:] - unmasked[1][0, hi:]).abs().max() > 1e-2


def test_a_resumed_loader_packs_exactly_what_the_uninterrupted_one_packs():
    """The dataloader's checkpoint state (what dcp saves) in the middle of an epoch: a fresh loader
    that loads it yields the same packed batches as the uninterrupted one, across the epoch's end."""
    import torch

    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan

    exp = validate_experiment(compose("experiment=tiny_sft", "data.pack=true"))
    config = loader_config(exp, str(TOKENIZER_DIR), validation=False)

    def loader():
        return ChatDataLoader(config, dp_world_size=2, dp_rank=1, seq_len=SEQ, local_batch_size=16)

    first = loader()
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    want = [next(it) for _ in range(3)]  # about 70 rows per epoch: the epoch ends among these
    again = loader()
    again.load_state_dict(state)
    got = [b for b, _ in zip(again, range(3), strict=False)]
    for (x, y), (gx, gy) in zip(want, got, strict=True):
        assert torch.equal(x["input"], gx["input"]) and torch.equal(x["positions"], gx["positions"])
        assert torch.equal(y, gy)
    assert first.dataset._epoch == again.dataset._epoch == 1  # the resumed loader crossed the epoch's end too


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "hf"])
def test_packed_step1_loss_equals_transformers_on_each_conversation(tmp_path, backend):
    """2 ranks, weights from a transformers checkpoint, data.pack=true, 2 packed rows per rank: the
    run's first batches are the greedy packing of each rank's conversations (r, r+2, ...; validation
    off), and its step-1 loss (the sum over the trained labels of both ranks / their count) equals
    transformers' mean loss over the same conversations, each its own row from position 0 with the
    same labels: the document mask makes the packed conversations independent."""
    ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=3)
    run_dir = tmp_path / "run"
    model = ("model.flavor=auto",) if backend == "native" else ("model=hf",)
    r = run_cli(
        "experiment=tiny_sft", *model, f"model.hf_assets_path={ckpt}", "checkpoint=hf_load", "data.pack=true",
        "platform=cpu", "platform.threads_per_rank=1", "training.steps=2", "training.warmup_steps=1",
        "training.local_batch_size=2", "validation.enable=false", "metrics.tensorboard=false",
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    step1 = read_metrics(run_dir)[0]["loss"]
    tok = load_tokenizer(ckpt)
    inputs, labels = [], []
    for rank, (ids, y, pos) in enumerate(first_batches(run_dir)):
        rows = greedy(rank_conversations(rank, 2, None, tok))[:2]
        for row, packed in enumerate(rows):
            used = sum(len(x.ids) - 1 for _, x in packed)
            want = [t for _, x in packed for t in x.ids[:-1]] + [tok.pad_token_id] * (SEQ - used)
            assert ids[row].tolist() == want and (pos[row] == 0).sum() == len(packed) + (used < SEQ)
            for _, x in packed:
                n = len(x.ids) - 1
                inputs.append(x.ids[:-1] + [tok.pad_token_id] * (SEQ - n))
                labels.append([t if on else -100 for t, on in zip(x.ids[1:], x.trained[1:], strict=True)])
                labels[-1] += [-100] * (SEQ - n)
        assert sorted(t for t in y.flatten().tolist() if t != -100) == sorted(
            t for row in labels[-sum(len(p) for p in rows) :] for t in row if t != -100
        )
    ref = masked_loss(ckpt, inputs, labels)["loss"]
    assert abs(step1 - ref) < 1e-4, (step1, ref)


@pytest.mark.slow  # quick tier: packs every rank's sequences
def test_the_plan_counts_the_sequences_the_ranks_pack(tmp_path):
    """plan.json's data figures: the sequences of the training conversations of both ranks (one epoch)
    are the rows the ranks' loaders yield, their fill the conversation tokens' share of those rows,
    and the epochs count sequences; the plan says so."""
    from qwen3exp.plan.build import make_plan
    from qwen3exp.titan.chat_dataset import ChatDataset, loader_config  # lazy: imports torchtitan

    exp = validate_experiment(compose("experiment=tiny_sft", "data.pack=true", "dry_run=true", "platform=cpu"))
    plan = make_plan(exp, tmp_path)
    data = plan.as_json()["data"]
    config = dataclasses.replace(loader_config(exp, str(TOKENIZER_DIR), validation=False), infinite=False)
    tok = load_tokenizer(TOKENIZER_DIR)
    rows = tokens = 0
    for rank in range(2):
        rows += sum(1 for _ in ChatDataset(config, seq_len=SEQ, dp_rank=rank, dp_world_size=2))
        tokens += sum(len(r.ids) - 1 for _, r in rank_conversations(rank, 2, exp.validation.fraction, tok))
    assert plan.mesh.dp_replicate * plan.mesh.dp_shard == 2
    assert data["sequences"] == rows and data["fill"] == pytest.approx(tokens / (rows * SEQ))
    assert data["epochs"] == pytest.approx(exp.training.steps * plan.batches.global_batch_size / rows)
    r = run_cli("experiment=tiny_sft", "data.pack=true", "dry_run=true", f"hydra.run.dir={tmp_path / 'cli'}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"packed (data.pack=true): the training conversations make {rows} sequences of {SEQ} tokens" in r.stdout
