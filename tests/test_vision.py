"""Vision transformers on images: patch metrics on hand-built maps, and a tiny ViT end to end
through `mh.hf.load`, `mh.analyze` and `multihead analyze --images`."""

import json

import pytest
import torch

import multihead as mh
from conftest import run_cli
from multihead.analysis.labels import patch_label
from multihead.analysis.pipelines.vision import digit_images
from multihead.analysis.stats.patches import PatchStatistics
from reducing import chunk

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")


def _maps(rows):
    """(1, H, 17, 17) maps over [CLS] + a 4 x 4 grid, one head per row-function."""
    T = 17
    maps = torch.zeros(1, len(rows), T, T)
    for h, target in enumerate(rows):
        for i in range(T):
            maps[0, h, i, target(i)] = 1.0
    return maps


def test_patch_metrics_on_hand_built_heads():
    def right_neighbour(i):  # patch (r, c) -> (r, c+1), the last column -> (r, c-1); [CLS] -> itself
        if i == 0:
            return 0
        r, c = divmod(i - 1, 4)
        return 1 + r * 4 + (c + 1 if c < 3 else c - 1)

    maps = _maps([lambda i: 0, right_neighbour, lambda i: i])
    uniform = torch.full((1, 1, 17, 17), 1 / 17)
    stats = PatchStatistics(1, 4)
    stats.update(chunk(torch.cat([maps, uniform], 1)))
    m = {k: v[0] for k, v in stats.result().items()}
    halves = PatchStatistics(1, 4)  # streamed in chunks of rows: the same
    for start in (0, 9):
        halves.update(chunk(torch.cat([maps, uniform], 1)[:, :, start:start + 9], start=start, rows=17))
    for k, v in halves.result().items():
        torch.testing.assert_close(v[0], m[k], msg=k)
    assert m["cls"].tolist() == pytest.approx([1, 0, 0, 1 / 17])
    assert m["grid_distance"][:3].tolist() == pytest.approx([0, 1, 0])
    assert m["local_3x3"][:3].tolist() == pytest.approx([0, 1, 1])
    assert m["self"][:3].tolist() == pytest.approx([0, 0, 1])
    assert float(m["entropy_norm"][3]) == pytest.approx(1.0)
    labels = [patch_label({k: float(v[h]) for k, v in m.items()}) for h in range(4)]
    assert labels == ["cls", "local", "self", "broad"]


def _tiny_vit(folder):
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    model = transformers.ViTModel(config, add_pooling_layer=False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_vit_folder_is_analysed_on_images(tmp_path, capsys):
    folder = _tiny_vit(tmp_path / "vit")
    model = mh.hf.load(folder)
    assert model.processor is not None and model.tokenizer is None and (model.num_layers, model.num_heads) == (2, 4)
    images = digit_images(12)
    report = mh.analyze(model, images, batch_size=5)
    assert report.stack == "vision" and report.sentences == 12 and report.tokens == 12 * 16
    assert len(report.heads) == 8 and all(r.label in ("cls", "self", "local", "broad", "mixed") for r in report.heads)
    # the same numbers from transformers' own maps
    pixels = model.processor(images=images, return_tensors="pt")["pixel_values"]
    eager = transformers.ViTModel.from_pretrained(folder, attn_implementation="eager", add_pooling_layer=False)
    with torch.no_grad():
        maps = eager(pixel_values=pixels, output_attentions=True).attentions
    stats = PatchStatistics(2, 4)
    for layer, w in enumerate(maps):
        stats.update(chunk(w, layer=layer))
    for key, value in stats.result().items():
        got = torch.tensor([[report.head(la, h).metrics[key] for h in range(4)] for la in range(2)])
        torch.testing.assert_close(got, value, atol=1e-5, rtol=1e-5, check_dtype=False)
    code, out, err = run_cli(["analyze", "--model", str(folder), "--images", "digits", "--sample", "10", "--out",
                              str(tmp_path / "r")], capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["stack"] == "vision" and data["sections"]["images"]["count"] == 10 and "layer |" in out
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<p>10 images, 160 patches; float32 on cpu." in page  # not 'texts' and 'tokens'
    assert page.count("<table>") >= 2 and 'src="data:image/png;base64,' in page  # heads over the first image
    assert "img-src data:" in page and "http" not in page.replace("http-equiv", "")
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for n, image in enumerate(images[:3]):
        image.save(pictures / f"{n}.png")
    code, _, err = run_cli(["analyze", "--model", str(folder), "--images", str(pictures), "--out",
                            str(tmp_path / "r2")], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "r2" / "report.json").read_text())["sections"]["images"]["count"] == 3


def test_an_image_classifiers_checkpoint_offloaded_gives_what_it_gives_in_memory(tmp_path):
    """A ViT saved with its classifier (most published ViT / DeiT checkpoints) holds no pooler; the
    base model built from it made a random one, which accelerate then could not read back from
    disk: the offloaded run stopped in its first forward on KeyError 'pooler.dense.weight'."""
    import warnings

    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=10)
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    transformers.ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(tmp_path / "vit")
    images = digit_images(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is newly initialised: no pooler to make
        in_memory = mh.hf.load(tmp_path / "vit")
    assert getattr(in_memory.body, "pooler", None) is None
    want = [h.metrics for h in mh.analyze(in_memory, images, progress=False).heads]
    offloaded = mh.hf.load(tmp_path / "vit", device_map="auto", max_memory={"cpu": "60KB"},
                           offload_folder=tmp_path / "off")
    assert "disk" in offloaded.model.hf_device_map.values()
    got = [h.metrics for h in mh.analyze(offloaded, images, progress=False).heads]
    assert got == want
    # a model pruned and saved from the base with its made-up pooler (as loaded before): loads onto today's
    with_pooler = transformers.ViTModel.from_pretrained(tmp_path / "vit")
    assert with_pooler.pooler is not None
    mh.heads.prune_heads(with_pooler, {0: [1]})
    mh.heads.save_pruned(with_pooler, tmp_path / "pruned", {0: [1]}, base=str(tmp_path / "vit"))
    pruned = mh.heads.load_pruned(mh.hf.load(tmp_path / "vit"), tmp_path / "pruned")
    assert mh.heads.count_heads(pruned) == [3, 4]
    saved = with_pooler.state_dict()
    assert all(torch.equal(value, saved[name]) for name, value in pruned.state_dict().items())


def test_gradient_importance_reads_a_vision_models_pixels(tmp_path):
    """head_importance took a batch's size from its input_ids: KeyError 'input_ids' on a ViT."""
    model = mh.hf.load(_tiny_vit(tmp_path / "vit"))
    pixels = model.processor(images=digit_images(4), return_tensors="pt")["pixel_values"]

    def loss(outputs, batch):  # the [CLS] state's squared size, one value an image
        return outputs.last_hidden_state[:, 0].square().sum(-1)  # (B,)

    got = mh.heads.head_importance(model, [{"pixel_values": pixels[:2]}, {"pixel_values": pixels[2:]}], loss)
    assert got.examples == 4 and got.raw.shape == (2, 4) and (got.raw > 0).all()
    with pytest.raises(ValueError, match=r"a batch holds none of the model's inputs \(input_ids, .*got 'images'"):
        mh.heads.head_importance(model, [{"images": pixels}], loss)


@pytest.mark.parametrize("heads", [[4, 4], [2, 4]])
def test_a_model_that_attends_within_windows_is_refused_in_one_line(heads):
    """Swin's attention runs over windows of patches, each window a batch row: it was analysed as
    if each window were an image (max_weight 0.016 over 16 keys, '128 patch rows' for 2 images),
    or refused as 'pruned?' where its stages have different head counts."""
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=heads,
                                     window_size=4)
    with pytest.raises(mh.hf.UnsupportedModelError) as refused:
        mh.hf.wrap(transformers.SwinModel(config), None, name="swin")
    message = str(refused.value)
    assert message.startswith("SwinModel (swin): its attention runs within windows of patches") and "\n" not in message
    assert "pruned" not in message
    # a Swin inside: a vision encoder-decoder (Donut's shape) keeps its parts' configs as .encoder / .decoder
    decoder = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                      vocab_size=120, is_decoder=True, add_cross_attention=True)
    both = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(config, decoder)
    with pytest.raises(mh.hf.UnsupportedModelError, match=r"^VisionEncoderDecoderModel \(swin\): its attention runs"):
        mh.hf.wrap(transformers.VisionEncoderDecoderModel(both), None, name="donut")


def test_images_with_the_wrong_model_or_folder_fail_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [(["--images", str(tmp_path / "none")], "no such folder"),
             (["--images", str(empty)], "holds no image"),
             (["--images", "digits", "some text"], "do not add TEXT"),
             (["--images", "digits", "--sample", "0"], "--sample: --images digits takes 1 to 1,797"),
             (["--images", "digits", "--sample", "5000"], "of scikit-learn's digits; got 5,000")]
    for args, words in cases:
        code, _, err = run_cli(["analyze", *args, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "o").exists()
    # what measures heads against a text model's objective, asked of a vision model: one line, not silently skipped
    vit = _tiny_vit(tmp_path / "vit")
    for args, words in ((["--ablation", "4"], "--ablation measures each head against a one-stack text model's own "
                                              "objective; vit is a vision model"),
                        (["--exact-ablation"], "--exact-ablation measures each head"),
                        (["--syntax", "spacy"], "--syntax spacy parses texts; --images gives images")):
        code, _, err = run_cli(["analyze", "--model", str(vit), "--images", "digits", "--sample", "4", *args,
                                "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "o").exists()
    with pytest.raises(TypeError, match=r"vit is a vision model: give it images \(PIL images or arrays\), not texts"):
        mh.analyze(mh.hf.load(vit), ["hello world"])
    with pytest.raises(ValueError, match="ablation measures heads against a one-stack text model's own objective"):
        mh.analyze(mh.hf.load(vit), digit_images(2), ablation=2)
    # view draws texts: a vision model said in one line ('NoneType' object is not callable, from its tokenizer)
    folder = vit
    code, _, err = run_cli(["view", "--model", str(folder), "--out", str(tmp_path / "v.html")], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"multihead view: error: view draws texts; vit is a vision model: its heads over images are on the page "
        f"`multihead analyze --model {folder} --images FOLDER` writes (report.html)"], err
    assert not (tmp_path / "v.html").exists()


def test_a_vit_folder_loads_where_the_auto_image_processor_needs_torchvision(tmp_path, monkeypatch):
    """transformers 5.17's AutoImageProcessor needs torchvision even for a PIL processor (5.25's and
    4.x's do not): the class the folder names is loaded instead, reading the same pixels; a folder
    naming no class it has is one line."""
    folder = _tiny_vit(tmp_path / "vit")
    images = digit_images(3)
    auto = mh.hf.load(folder).processor(images=images, return_tensors="pt")["pixel_values"]

    def needs_torchvision(*args, **kwargs):
        raise ImportError("AutoImageProcessor requires the Torchvision library but it was not found")

    try:
        monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", needs_torchvision)
    except ImportError:  # this transformers' auto class needs torchvision itself (5.17 without it): as simulated
        pass
    processor = mh.hf.load(folder).processor
    assert type(processor).__name__.startswith("ViTImageProcessor")
    torch.testing.assert_close(processor(images=images, return_tensors="pt")["pixel_values"], auto)
    config = folder / "preprocessor_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "image_processor_type": "NoSuchProcessor"}))
    with pytest.raises(ValueError, match=r"its image processor cannot be loaded with transformers .*torchvision"):
        mh.hf.load(folder)
