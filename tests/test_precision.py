"""The CUDA path, checked on the CPU where PyTorch allows: which part runs in which precision under bf16 autocast,
captioning with the feature cache under bf16 (it crashed), decoding under the checkpoint's precision, host copies
kept on the host, and the device settings a GPU gets (TF32, loader workers)."""

import pytest
import torch

from attnkit import distributed
from attnkit.captioning import Captioner, train_captioning
from attnkit.config import load_config
from attnkit.data.batching import pad_sequences
from attnkit.data.features import FeatureCache, encoder_identity
from attnkit.distributed import loader_workers, resolve_device
from attnkit.errors import UserError
from attnkit.files import file_digest
from attnkit.interfaces import GridFeatures
from attnkit.losses import Seq2SeqObjective
from attnkit.precision import OperationCount, PrecisionProbe, without_autocast
from attnkit.translation import Translator, train_translation
from conftest import tiny_model
from test_captioning import TINY, write_shape_images
from test_feature_cache import _encoder, _photos, weights  # noqa: F401 (weights: a fixture)

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def batch_of(vocab, sentences=((4, 5, 6), (7, 8))):
    from attnkit.data.batching import Batch

    source = pad_sequences([list(s) for s in sentences])
    target = pad_sequences([[vocab.bos_index, *s, vocab.eos_index] for s in sentences]).ids
    return Batch(source, target, torch.arange(len(sentences)))


@pytest.mark.parametrize("decoder", [dict(style="bahdanau", rnn="gru"), dict(style="luong", rnn="lstm"), dict(style="luong", rnn="gru", input_feeding=True)])
def test_recurrent_layers_run_in_fp32_under_bf16_autocast_and_the_rest_in_bf16(vocab, decoder):
    model = tiny_model(vocab, **decoder).train()
    parts = ["encoders.text", "decoder.rnn", "decoder.readout", "decoder.output"]
    with torch.autocast(**BF16), PrecisionProbe(model, parts) as probe:
        Seq2SeqObjective(label_smoothing=0.1)(model, batch_of(vocab)).loss().backward()
    seen = probe.report()
    dtypes = lambda part: {dtype for ops in seen[part].values() for dtype in ops}  # noqa: E731
    assert dtypes("encoders.text") == {"float32"} and dtypes("decoder.rnn") == {"float32"}
    assert dtypes("decoder.readout") == {"bfloat16"} and dtypes("decoder.output") == {"bfloat16"}
    assert seen["other"]["_log_softmax"] == ["float32"]  # the loss


def test_the_decoder_state_stays_fp32_step_after_step_under_autocast(vocab):
    model = tiny_model(vocab, rnn="lstm")
    source = pad_sequences([[4, 5, 6]])
    with torch.no_grad(), torch.autocast(**BF16):
        state = model.decoder.init_state(model.encode(source))
        for word in (vocab.bos_index, 4, 5):
            state = model.decoder.step(torch.tensor([word]), state).state
    assert state.hidden.dtype == state.cell.dtype == torch.float32


def test_without_autocast_switches_it_off_and_back():
    with torch.autocast(**BF16):
        with without_autocast():
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")


def test_the_operation_count_sees_autocast_s_casts_forward_and_backward():
    layer = torch.nn.Linear(4, 3)
    inputs = torch.randn(2, 4)

    def counted(autocast: bool) -> OperationCount:
        layer.zero_grad(set_to_none=True)  # each backward writes fresh gradients (accumulating would add operations)
        with OperationCount() as count, torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            layer(inputs).float().sum().backward()
        return count

    plain, mixed = counted(False), counted(True)
    # forward: the input, the weight and the bias to bf16, the output back to fp32 (4); backward: the output's
    # gradient to bf16, the weight's and the bias's gradients back to fp32 (3)
    assert (plain.casts, mixed.casts) == (0, 7)
    assert mixed.operations == plain.operations + mixed.casts  # the same products, and the casts


def test_label_smoothing_without_list_indexing_keeps_its_value(vocab):
    """The smoothed loss reads <pad> and <bos> column by column now; its value is the definition's."""
    model = tiny_model(vocab)
    batch = batch_of(vocab)
    output = model(batch)
    log_probs = output.logits.float().log_softmax(-1)
    targets = batch.target[:, 1:]
    real = targets != vocab.pad_index
    allowed = [i for i in range(len(vocab)) if i not in (vocab.pad_index, vocab.bos_index)]
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    expected = ((0.9 * nll + 0.1 * -log_probs[..., allowed].mean(-1)) * real).sum()
    found = Seq2SeqObjective(label_smoothing=0.1, pad_index=vocab.pad_index, bos_index=vocab.bos_index)(model, batch)
    assert torch.allclose(found.per_token_sum, expected, atol=1e-5)
    assert found.examples.dtype == torch.int64 and int(found.examples) == 2


def test_token_lengths_keep_their_host_copy_wherever_the_batch_goes():
    tokens = pad_sequences([[4, 5, 6], [7]])
    assert tokens.host_lengths.device.type == "cpu" and tokens.host_lengths.tolist() == [3, 1]
    moved = tokens.to("meta")  # any device: the host copy stays behind for packing
    assert moved.lengths.device.type == "meta" and moved.host_lengths is tokens.host_lengths


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_packing_from_the_host_lengths_equals_torch_s_unsorted_packing(rnn):
    from torch.nn.utils.rnn import pack_padded_sequence

    from attnkit.config import TextEncoderConfig
    from attnkit.encoders.text import TextEncoder, pack_from_host_lengths

    torch.manual_seed(0)
    encoder = TextEncoder(TextEncoderConfig(rnn=rnn, embedding_size=6, hidden_size=5, num_layers=2, dropout=0.0), 12).eval()
    tokens = pad_sequences([[4, 5], [6, 7, 8, 9], [10], [4, 4, 4]])
    embedded = encoder.embedding(tokens.ids)
    ours = encoder.rnn(pack_from_host_lengths(embedded, tokens.host_lengths))
    theirs = encoder.rnn(pack_padded_sequence(embedded, tokens.lengths, batch_first=True, enforce_sorted=False))
    assert torch.equal(ours[0].data, theirs[0].data) and torch.equal(ours[0].unsorted_indices, theirs[0].unsorted_indices)
    for mine, reference in zip(torch.utils._pytree.tree_leaves(ours[1]), torch.utils._pytree.tree_leaves(theirs[1])):
        assert torch.equal(mine, reference)  # the final states, back in the batch's order
    from torch.nn.utils.rnn import pad_packed_sequence

    from attnkit.encoders.text import unpack_in_batch_order

    assert torch.equal(unpack_in_batch_order(ours[0], 6), pad_packed_sequence(theirs[0], batch_first=True, total_length=6)[0])


def test_cached_features_travel_in_fp16_and_are_upcast_on_arrival():
    features = GridFeatures(torch.ones(2, 3, 2, 2, dtype=torch.float16))
    moved = features.to("cpu")
    assert moved.features.dtype == torch.float32 and features.features.dtype == torch.float16


def test_the_cache_reads_and_computes_the_same_features_under_autocast(tmp_path, weights):
    """It crashed: stacking fp16 features under CPU bf16 autocast. And features do not depend on the precision."""
    encoder = _encoder(weights)
    photos = _photos(tmp_path)
    identity = encoder_identity(encoder)
    plain = FeatureCache(tmp_path / "plain", identity).get(photos, encoder.grid_features)
    with torch.autocast(**BF16):
        computed = FeatureCache(tmp_path / "autocast", identity).get(photos, encoder.grid_features)
        read = FeatureCache(tmp_path / "autocast", identity).get(photos, encoder.grid_features)
    assert computed.dtype == read.dtype == torch.float16
    assert torch.equal(computed, plain) and torch.equal(read, plain)


def test_a_cache_kept_in_memory_reads_each_file_once(tmp_path, weights):
    encoder = _encoder(weights)
    photos = _photos(tmp_path)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    first = cache.kept_in_memory()
    features = first.get(photos, encoder.grid_features)
    for entry in cache.folder.glob("*.pt"):
        entry.unlink()  # the second epoch's validation must not need the files
    assert torch.equal(first.get(photos, encoder.grid_features), features) and first.stats.misses == len(photos)


@pytest.mark.slow
def test_captioning_trains_and_resumes_in_bf16_with_the_feature_cache(tmp_path, weights):
    scenes = write_shape_images(tmp_path)
    overrides = [f"image_encoder.weights={weights}", f"data.feature_cache={tmp_path / 'cache'}", "train.precision=bf16"]
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY, *overrides])
    assert train_captioning(config, progress_bar=False, log=lambda _: None).epoch == 1  # validation ran, in bf16
    resumed = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=2", *TINY, *overrides])
    from attnkit.checkpoint import load_checkpoint

    printed = []
    assert train_captioning(resumed, resume=load_checkpoint(tmp_path / "run" / "last.pt"), progress_bar=False, log=printed.append).epoch == 2
    # The resumed run keeps the backbone's digest (it loads no weights file), so it trains on the cached features.
    assert "feature cache: 12 hits, 0 computed" in printed
    assert load_checkpoint(tmp_path / "run" / "last.pt").config["image_encoder"]["weights_sha256"] == file_digest(weights)
    captioner = Captioner.from_checkpoint(tmp_path / "run" / "best.pt", device="cpu", cache_dir=tmp_path / "cache")
    assert captioner.precision == torch.bfloat16  # decodes as its validation did
    assert all(not c[0].error for c in captioner.caption(sorted((tmp_path / "images").iterdir())))


@pytest.mark.slow
@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("auto", torch.float32)])
def test_a_translator_decodes_under_its_checkpoint_s_precision(toy_data, tmp_path, precision, dtype):
    config = load_config(
        "tasks/configs/tiny.yaml", [f"data.path={toy_data}", f"output_dir={tmp_path}", "train.epochs=1", f"train.precision={precision}", "train.valid_max_examples=10"]
    )  # fmt: skip
    train_translation(config, progress_bar=False, log=lambda _: None)
    translator = Translator.from_checkpoint(tmp_path / "best.pt", device="cpu")
    assert translator.precision == dtype  # auto is fp32 on a CPU, as training's validation was
    assert translator.translate(["a b c"])[0][0].error is None


def test_fp16_on_a_cpu_trains_with_the_loss_scaler(toy_data, tmp_path):
    """Unscaled fp16 gradients underflow on any device; the scaler used to run on CUDA only."""
    from attnkit.checkpoint import load_checkpoint

    config = load_config(
        "tasks/configs/tiny.yaml", [f"data.path={toy_data}", f"output_dir={tmp_path}", "train.epochs=1", "train.precision=fp16", "train.valid_max_examples=10"]
    )  # fmt: skip
    train_translation(config, progress_bar=False, log=lambda _: None)
    scaler = load_checkpoint(tmp_path / "last.pt").training["scaler"]
    assert scaler["scale"] > 0  # a disabled scaler saves an empty state


def test_cuda_uses_tf32_for_fp32_products_and_the_device_asked_becomes_the_current_one(monkeypatch):
    monkeypatch.setattr(distributed, "_device_named", lambda name: torch.device(name))
    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert resolve_device("cuda:1") == torch.device("cuda", 1) and torch.get_float32_matmul_precision() == "high"
        assert resolve_device("cuda").type == "cuda"  # no index: the current device stays as it is
        assert made_current == [torch.device("cuda", 1)]
    finally:
        torch.set_float32_matmul_precision(previous)


def test_loader_workers_scale_with_the_cores_and_the_ranks(monkeypatch):
    monkeypatch.setattr(distributed, "usable_cores", lambda: 16)
    assert loader_workers() == 8 and loader_workers(2) == 7 and loader_workers(8) == 1
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    assert loader_workers() == 1


def _cpu_probes(monkeypatch, machine: str, bf16_instructions: bool, amx: bool) -> None:
    monkeypatch.setattr(distributed.platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_instructions)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize(
    "machine, bf16_instructions, amx, warned",
    [("x86_64", False, False, True), ("x86_64", True, False, False), ("x86_64", False, True, False), ("aarch64", False, False, False)],
)
def test_bf16_is_said_to_be_slow_on_an_x86_cpu_without_bf16_instructions_alone(monkeypatch, machine, bf16_instructions, amx, warned):
    """Autocast's bf16 products run in software there: the Multi30k Transformer recipe trained 22x slower than in fp32
    on two AVX2 cores (BENCHMARKS.md). Another architecture's instructions are not probed, so nothing is claimed."""
    _cpu_probes(monkeypatch, machine, bf16_instructions, amx)
    warning = distributed.slow_precision_warning(torch.device("cpu"), torch.bfloat16)
    assert (warning is not None) == warned and (warning is None or "--set train.precision=fp32" in warning)
    assert distributed.slow_precision_warning(torch.device("cpu"), torch.float32) is None  # fp32 is never slow for want of instructions
    assert distributed.slow_precision_warning(torch.device("cuda"), torch.bfloat16) is None


def test_the_slow_bf16_warning_is_a_line_before_training(toy_data, tmp_path, monkeypatch):
    _cpu_probes(monkeypatch, "x86_64", bf16_instructions=False, amx=False)
    lines = []
    config = load_config(
        "tasks/configs/tiny.yaml", [f"data.path={toy_data}", f"output_dir={tmp_path}", "train.epochs=1", "train.precision=bf16", "train.valid_max_examples=10"]
    )  # fmt: skip
    train_translation(config, progress_bar=False, log=lines.append)
    warnings = [line for line in lines if line.startswith("warning: bf16 autocast on a CPU without bf16 instructions")]
    assert len(warnings) == 1 and "--set train.precision=fp32" in warnings[0]
    assert lines.index(warnings[0]) < next(i for i, line in enumerate(lines) if line.startswith("epoch 1"))  # said before the first epoch


def test_a_bf16_checkpoint_decodes_in_fp32_when_asked_and_is_said_to_be_slow_otherwise(toy_data, tmp_path, monkeypatch, capsys):
    """Decoding takes the checkpoint's precision (as its validation did); on an x86 CPU without bf16 instructions that
    is 3.3-4.2x slower than fp32 (bench/beam_speed.py --precision), so the commands say so and take --precision fp32."""
    import json

    from attnkit.commands import main

    _cpu_probes(monkeypatch, "x86_64", bf16_instructions=False, amx=False)
    config = load_config(
        "tasks/configs/tiny.yaml", [f"data.path={toy_data}", f"output_dir={tmp_path}", "train.epochs=1", "train.precision=bf16", "train.valid_max_examples=10"]
    )  # fmt: skip
    train_translation(config, progress_bar=False, log=lambda _: None)
    checkpoint = str(tmp_path / "best.pt")
    slow = "warning: bf16 autocast on a CPU without bf16 instructions"

    assert main(["translate", "--checkpoint", checkpoint, "--device", "cpu", "a b c"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(slow)]
    assert said == [distributed.slow_precision_warning(torch.device("cpu"), torch.bfloat16, decoding=True)]
    assert "--precision fp32 decodes in fp32" in said[0]
    assert main(["translate", "--checkpoint", checkpoint, "--device", "cpu", "--precision", "fp32", "a b c"]) == 0
    assert slow not in capsys.readouterr().err

    evaluate = ["evaluate", "--checkpoint", checkpoint, "--device", "cpu", "--data", str(toy_data), "--split", "test", "--limit", "8"]
    assert main([*evaluate, "--precision", "fp32"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["precision"] == "fp32" and slow not in captured.err
    assert main(evaluate) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "bf16"  # the checkpoint's, by default

    assert Translator.from_checkpoint(checkpoint, device="cpu", precision="fp32").precision == torch.float32
    with pytest.raises(UserError, match="the decoding precision must be checkpoint, fp32, bf16, got 'half'"):
        Translator.from_checkpoint(checkpoint, device="cpu", precision="half")
    with pytest.raises(SystemExit) as refused:  # argparse names the choices
        main(["translate", "--checkpoint", checkpoint, "--precision", "half", "a"])
    assert refused.value.code == 2 and "invalid choice: 'half'" in capsys.readouterr().err


@pytest.mark.slow  # bf16 training of the tiny CNN: 20 s on a CPU without bf16 instructions
def test_a_bf16_captioner_and_its_ensemble_decode_in_fp32_when_asked(tmp_path, monkeypatch, capsys):
    import json

    from attnkit.commands import main

    _cpu_probes(monkeypatch, "x86_64", bf16_instructions=False, amx=False)
    scenes = write_shape_images(tmp_path)
    config = load_config(None, [f"data.path={scenes}", f"output_dir={tmp_path / 'run'}", "train.epochs=1", *TINY, "train.precision=bf16"])
    train_captioning(config, progress_bar=False, log=lambda _: None)
    checkpoint, photo = str(tmp_path / "run" / "best.pt"), str(tmp_path / "images" / "red-square.png")
    slow = "warning: bf16 autocast on a CPU without bf16 instructions"

    assert main(["caption", "--checkpoint", checkpoint, "--device", "cpu", photo]) == 0
    assert sum(line.startswith(slow) for line in capsys.readouterr().err.splitlines()) == 1
    assert main(["caption", "--checkpoint", checkpoint, "--device", "cpu", "--precision", "fp32", photo]) == 0
    assert slow not in capsys.readouterr().err

    ensemble = ["evaluate", "--checkpoint", checkpoint, "--checkpoint", checkpoint, "--split", "test", "--device", "cpu", "--limit", "4"]
    assert main([*ensemble, "--precision", "fp32"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == "fp32"
    assert main(ensemble) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["precision"] == "bf16" and slow in captured.err
