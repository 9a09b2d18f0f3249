"""Whisper's tokenizer: text ↔ token ids for a CTranslate2 model directory.

Encoding runs the HF `tokenizers` BPE from tokenizer.json with its added tokens and
post-processor stripped, so text can never turn into a control token. Decoding uses the
id → token table (tokenizer.json cross-checked against vocabulary.json / vocabulary.txt, which
also carry the timestamp tokens that tiny.en's tokenizer.json lacks) and GPT-2's byte map.
Special tokens are looked up by name, never by id.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from tensorplan.errors import ModelError, UserError
from tensorplan.files import MAX_MODEL_TEXT_BYTES, read_text

# openai-whisper's LANGUAGES, in the order of the <|xx|> tokens after <|startoftranscript|>.
LANGUAGES: dict[str, str] = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}

# language code by name, with openai-whisper's aliases
TO_LANGUAGE_CODE: dict[str, str] = {
    **{name: code for code, name in LANGUAGES.items()},
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}

# codes older tokenizer exports use (tiny.en's tokenizer.json has <|iw|> where openai has <|he|>)
LEGACY_LANGUAGE_CODES: dict[str, str] = {"iw": "he"}

TASKS = ("transcribe", "translate")

# languages written without spaces: words are split at unicode boundaries instead
UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})

N_TIMESTAMPS = 1501  # <|0.00|> … <|30.00|> in steps of 0.02 s


def to_language_code(language: str) -> str:
    """'en', 'English' or an alias such as 'mandarin' → the code; UserError if unknown."""
    key = language.strip().lower()
    if key in LANGUAGES:
        return key
    if key in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[key]
    if key in LEGACY_LANGUAGE_CODES:
        return LEGACY_LANGUAGE_CODES[key]
    raise UserError(
        f"unknown language {language!r} (use a code like 'en' or a name like 'english')"
    )


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, reversed: each printable stand-in character → its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_DECODER = _gpt2_byte_decoder()


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A Whisper vocabulary: encode/decode plus its special tokens, found by name."""

    encoder: tokenizers.Tokenizer = field(repr=False)  # the BPE only: no added tokens
    vocab: tuple[str, ...] = field(repr=False)  # id → token string, for every id < n_vocab
    is_multilingual: bool

    @property
    def n_vocab(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Text → BPE ids. Text that spells a special token ("<|en|>") stays plain text."""
        return list(self.encoder.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text tokens → text; ids ≥ eot (specials, timestamps) are dropped."""
        eot = self.eot
        return self._join(i for i in self._checked(token_ids) if i < eot)

    def decode_with_timestamps(self, token_ids: Iterable[int]) -> str:
        """Every id rendered, specials and timestamps as written, e.g. "<|1.08|> Hi<|1.50|>"."""
        return self._join(self._checked(token_ids))

    # special tokens, by name
    @cached_property
    def special_tokens(self) -> dict[str, int]:
        """Every `<|…|>` token → its id."""
        return {
            t: i
            for i, t in enumerate(self.vocab)
            if len(t) > 4 and t.startswith("<|") and t.endswith("|>")
        }

    @cached_property
    def eot(self) -> int:
        return self._special("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._special("<|startoftranscript|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._special("<|startofprev|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._special("<|startoflm|>")

    @cached_property
    def no_speech(self) -> int:
        return self._special("<|nospeech|>", "<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._special("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        return self._special("<|0.00|>")

    @cached_property
    def transcribe(self) -> int:
        return self._special("<|transcribe|>")

    @cached_property
    def translate(self) -> int:
        return self._special("<|translate|>")

    @cached_property
    def language_tokens(self) -> dict[str, int]:
        """Language code → token id, in id order; a legacy <|iw|> counts as "he"."""
        codes = (
            (LEGACY_LANGUAGE_CODES.get(t[2:-2], t[2:-2]), i) for t, i in self.special_tokens.items()
        )
        return {code: i for code, i in codes if code in LANGUAGES}

    @cached_property
    def all_language_tokens(self) -> tuple[int, ...]:
        return tuple(self.language_tokens.values())

    @cached_property
    def all_language_codes(self) -> tuple[str, ...]:
        return tuple(self.language_tokens)

    def language_token(self, language: str) -> int:
        """The id of `<|code|>` for a code or language name; UserError if the model lacks it."""
        code = to_language_code(language)
        if (token := self.language_tokens.get(code)) is None:
            raise UserError(
                f"this model has no <|{code}|> token: language {language!r} unsupported"
            )
        return token

    def sot_sequence(
        self, language: str | None = None, task: str = "transcribe"
    ) -> tuple[int, ...]:
        """[sot] for English-only models; [sot, <|lang|>, <|task|>] for multilingual ones."""
        if task not in TASKS:
            raise UserError(f"unknown task {task!r} (choose transcribe or translate)")
        if not self.is_multilingual:
            if language is not None and to_language_code(language) != "en":
                raise UserError(f"this model is English-only; it cannot transcribe {language!r}")
            if task == "translate":
                raise UserError("this model is English-only; it cannot translate")
            return (self.sot,)
        if language is None:
            raise ValueError("a multilingual model needs a language: detect it first")
        task_token = self.transcribe if task == "transcribe" else self.translate
        return (self.sot, self.language_token(language), task_token)

    def sot_sequence_including_notimestamps(
        self, language: str | None = None, task: str = "transcribe"
    ) -> tuple[int, ...]:
        return (*self.sot_sequence(language, task), self.no_timestamps)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """openai-whisper's list: tokens of speaker tags and non-speech annotations (♪, [, (…).

        Basic punctuation stays allowed, and so do "-" and "'" inside words.
        """
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        # U+2640..U+267F symbols: their 3-byte UTF-8 forms share the first two bytes, so when
        # one is split into several tokens, suppressing the first token is safe
        miscellaneous = set("♩♪♫♬♭♮♯")
        # (a BPE lacking some bytes encodes them to nothing: skip those, never IndexError)
        result = {*self.encode(" -")[:1], *self.encode(" '")[:1]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if tokens and (len(tokens) == 1 or symbol in miscellaneous):
                    result.add(tokens[0])
        return tuple(sorted(result))

    # words, for word-level timestamps
    def split_to_word_tokens(
        self, tokens: Sequence[int], language: str | None = None
    ) -> tuple[list[str], list[list[int]]]:
        """Group tokens into words: at spaces and punctuation, or at every complete unicode
        character for languages written without spaces (zh, ja, th, lo, my, yue)."""
        if language is not None and to_language_code(language) in UNSPACED_LANGUAGES:
            return self.split_tokens_on_unicode(tokens)
        return self.split_tokens_on_spaces(tokens)

    def split_tokens_on_unicode(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """Cut wherever the tokens so far decode to whole characters (a U+FFFD that is also in
        the full decode is a real invalid sequence, not a character split across tokens)."""
        full = self.decode_with_timestamps(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode_with_timestamps(current)
            bad = decoded.find("\ufffd")
            if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":
                words.append(decoded)
                word_tokens.append(current)
                current = []
                offset += len(decoded)
        return words, word_tokens

    def split_tokens_on_spaces(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """A word starts at a special token, a leading space or punctuation."""
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, subword_tokens in zip(*self.split_tokens_on_unicode(tokens), strict=True):
            special = subword_tokens[0] >= self.eot
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or not words:
                words.append(subword)
                word_tokens.append(subword_tokens)
            else:
                words[-1] += subword
                word_tokens[-1].extend(subword_tokens)
        return words, word_tokens

    # internals
    @cached_property
    def _token_bytes(self) -> tuple[bytes, ...]:
        """Each id's bytes: byte-level BPE strings mapped back; specials as UTF-8 text."""
        eot = self.eot
        try:
            return tuple(
                bytes(_BYTE_DECODER[c] for c in t) if i < eot else t.encode()
                for i, t in enumerate(self.vocab)
            )
        except KeyError as e:
            raise ModelError(f"a text token holds {e.args[0]!r}, which is no BPE byte") from e

    def _join(self, token_ids: Iterable[int]) -> str:
        table = self._token_bytes
        return b"".join(table[i] for i in token_ids).decode("utf-8", errors="replace")

    def _checked(self, token_ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in token_ids]
        if ids and (min(ids) < 0 or max(ids) >= self.n_vocab):
            bad = next(i for i in ids if not 0 <= i < self.n_vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.n_vocab})")
        return ids

    def _special(self, *names: str) -> int:
        for name in names:
            if name in self.special_tokens:
                return self.special_tokens[name]
        raise ModelError(f"the vocabulary has no {' or '.join(names)} token")


# what every Whisper vocabulary must have (and every text token must be a BPE byte string)
_CHECKED_AT_LOAD = (
    "eot",
    "sot",
    "sot_prev",
    "sot_lm",
    "no_speech",
    "no_timestamps",
    "_token_bytes",
)


def load_tokenizer(model_dir: str | os.PathLike[str]) -> Tokenizer:
    """Load a CTranslate2 model directory's tokenizer; ModelError if it is missing or broken."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"{model_dir}: no such model directory")
    path = model_dir / "tokenizer.json"
    spec = _read_json(path, required=True)
    bpe_vocab, merges = _bpe_model(spec, path)
    table = _json_token_table(spec, bpe_vocab, path)
    vocab = _merge_vocabulary(table, *_vocabulary_file(model_dir), path)
    tokenizer = Tokenizer(
        encoder=_bpe_encoder(spec, merges, path),
        vocab=tuple(vocab),
        # GPT-2's English BPE has <|endoftext|> as its last merge rank; the multilingual one has
        # its own ranks and adds every special after them
        is_multilingual="<|endoftext|>" not in bpe_vocab,
    )
    try:  # fail now, not at the first decode
        for name in _CHECKED_AT_LOAD:
            getattr(tokenizer, name)
    except ModelError as e:
        raise ModelError(f"{path}: {e}") from None
    _check_kind(tokenizer, path)
    return tokenizer


ENGLISH_N_VOCAB = 51864  # every English-only Whisper; multilingual ones have 51865 or more


def _check_kind(tokenizer: Tokenizer, path: Path) -> None:
    """The BPE's kind (GPT-2's English BPE holds <|endoftext|>) must agree with the vocabulary
    size openai-whisper's rule reads it from: a tokenizer.json that lost <|endoftext|> from an
    English BPE otherwise decodes as multilingual, into an empty or wrong transcript.
    Vocabularies smaller than Whisper's (test models) have no rule to check against."""
    n_vocab = tokenizer.n_vocab
    if n_vocab < ENGLISH_N_VOCAB or tokenizer.is_multilingual == (n_vocab > ENGLISH_N_VOCAB):
        return
    if tokenizer.is_multilingual:
        raise ModelError(f"{path}: the BPE vocabulary has no <|endoftext|>, as a multilingual "
                         f"model's, but {n_vocab} tokens is an English-only vocabulary")
    raise ModelError(f"{path}: the BPE vocabulary holds <|endoftext|>, as an English-only "
                     f"model's, but {n_vocab} tokens is a multilingual vocabulary")


def _library_failure(e: BaseException) -> bool:
    """An error from the tokenizers library. A Rust panic arrives as pyo3's PanicException,
    a BaseException: catch it by name, and never KeyboardInterrupt or SystemExit."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _read_text(path: Path) -> str | None:
    """A model text file (bounded: a FIFO or /dev/zero is refused), or None if absent."""
    if not os.path.lexists(path):
        return None
    try:
        return read_text(path, MAX_MODEL_TEXT_BYTES, "model file")
    except UserError as e:
        raise ModelError(str(e)) from None


def _read_json(path: Path, *, required: bool) -> Any:
    text = _read_text(path)
    if text is None:
        if required:
            raise ModelError(f"{path}: missing; the model directory needs this file")
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise ModelError(f"{path}: not valid JSON (nested too deeply)") from None


def _bpe_model(spec: Any, path: Path) -> tuple[dict[str, int], list[Any]]:
    model = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(model, dict):
        raise ModelError(f"{path}: not a tokenizers file (no 'model' object)")
    if model.get("type", "BPE") != "BPE":
        raise ModelError(f"{path}: not a BPE tokenizer (model type {model.get('type')!r})")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise ModelError(f"{path}: not a BPE tokenizer (needs a 'vocab' object and 'merges' list)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        # GPT-2's byte-level BPE has neither; the library panics on some (printing to stderr)
        if model.get(key) not in (None, ""):
            raise ModelError(f"{path}: {key} {str(model.get(key))[:20]!r} is not Whisper's (none)")
    return vocab, merges


def _json_token_table(
    spec: dict[str, Any], bpe_vocab: dict[str, int], path: Path
) -> dict[int, str]:
    """id → token from the BPE vocab plus the added tokens (specials, maybe timestamps)."""
    table: dict[int, str] = {}
    added = spec.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(a, dict) for a in added):
        raise ModelError(f"{path}: 'added_tokens' must be a list of objects")
    entries = [(i, t) for t, i in bpe_vocab.items()]
    entries += [(a.get("id"), a.get("content")) for a in added]
    for i, token in entries:
        if not isinstance(i, int) or i < 0 or not isinstance(token, str):
            raise ModelError(f"{path}: bad vocabulary entry {token!r} → {i!r}")
        if table.setdefault(i, token) != token:
            raise ModelError(f"{path}: token id {i} is both {table[i]!r} and {token!r}")
    if not table:
        raise ModelError(f"{path}: empty vocabulary")
    return table


def _vocabulary_file(model_dir: Path) -> tuple[list[str] | None, Path | None]:
    """CTranslate2's id → token list: vocabulary.json if present, else vocabulary.txt."""
    json_path = model_dir / "vocabulary.json"
    tokens = _read_json(json_path, required=False)
    if tokens is not None:
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ModelError(f"{json_path}: expected a JSON list of token strings")
        return tokens, json_path
    txt_path = model_dir / "vocabulary.txt"
    text = _read_text(txt_path)
    if text is None:
        return None, None
    lines = text.split("\n")  # not splitlines(): byte-level tokens may hold U+0085 etc.
    return (lines[:-1] if lines[-1] == "" else lines), txt_path


def _merge_vocabulary(
    table: dict[int, str], file_tokens: list[str] | None, file_path: Path | None, path: Path
) -> list[str]:
    """Cross-check tokenizer.json against the vocabulary file and fill gaps from either."""
    file_tokens = file_tokens or []
    vocab: list[str] = []
    for i in range(max(len(file_tokens), max(table) + 1)):
        ours, theirs = table.get(i), file_tokens[i] if i < len(file_tokens) else None
        if ours is not None and theirs is not None and ours != theirs:
            raise ModelError(f"{file_path}: token {i} is {theirs!r}, tokenizer.json says {ours!r}")
        token = ours if ours is not None else theirs
        if token is None:
            raise ModelError(f"{path}: token id {i} is missing (and no vocabulary file has it)")
        vocab.append(token)
    if "<|0.00|>" not in vocab and vocab[-1] == "<|notimestamps|>":
        # timestamps always follow <|notimestamps|>; old exports leave them out of every file
        vocab += [f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)]
    return vocab


def _is_pair(m: Any) -> bool:
    return isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m)


def _bpe_encoder(spec: dict[str, Any], merges: list[Any], path: Path) -> tokenizers.Tokenizer:
    """The BPE alone. Merges may be "Ġ t" strings or ["Ġ", "t"] pairs; if this tokenizers
    version rejects the file's format, retry with the other one."""
    if not all(isinstance(m, str) or _is_pair(m) for m in merges):
        raise ModelError(f"{path}: merges must be \"a b\" strings or [\"a\", \"b\"] pairs")
    as_strings = [m if isinstance(m, str) else " ".join(m) for m in merges]
    as_pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    formats = [as_strings, as_pairs]
    if merges and not isinstance(merges[0], str):
        formats.reverse()
    error: BaseException | None = None
    for candidate in formats:
        stripped = {
            **spec,
            "added_tokens": [],
            "post_processor": None,
            "model": {**spec["model"], "merges": candidate},
        }
        try:
            return tokenizers.Tokenizer.from_str(json.dumps(stripped))
        except BaseException as e:  # bare Exceptions, or a panic on odd settings
            if not _library_failure(e):
                raise
            error = error or e
    assert error is not None
    raise ModelError(f"{path}: the tokenizers library cannot load it ({_first_line(error)})")
