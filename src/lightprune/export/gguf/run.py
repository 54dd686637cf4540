"""llama.cpp's converter run in this process on an export (`run_converter`): its pre-tokenizer named when it
does not know the tokenizer, its logging, warnings and progress bar dropped unless the run is verbose, and its failures
restated in one line (a `GGUFConversionError` naming the step, or a
`WriteError` for a failed write of the staged GGUF); `tensor_count` reads the GGUF header it wrote."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from lightprune.core.notices import verbose
from lightprune.export.gguf.converter import CONVERTER, FETCH, GGUFConversionError, first_line

__all__ = ["run_converter", "tensor_count", "described", "WriteError"]

#: the converter's loggers (its own, gguf-py's and its metadata reader's)
_LOGGERS = ("hf-to-gguf", "gguf", "metadata")


def described(err: BaseException) -> str:
    """``Type: the first line of its message``; for an error without a message (a bare ``assert``), the source line
    that raised it."""
    if str(err).strip():
        return f"{type(err).__name__}: {first_line(err)}"
    frames = traceback.extract_tb(err.__traceback__)
    if frames and frames[-1].line:
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
        return f"{type(err).__name__}: {frames[-1].line.strip()} ({where})"
    return type(err).__name__


#: the converter's steps, by the function that runs each (the outermost of them in a traceback names the step)
_STEPS = {"load_hparams": "reading config.json", "get_model_architecture": "reading config.json",
          "get_model_class": "reading config.json", "index_tensors": "reading the weights",
          "set_vocab": "reading the tokenizer", "set_gguf_parameters": "reading config.json",
          "prepare_tensors": "converting the tensors", "write_header_to_file": "writing the GGUF",
          "write_kv_data_to_file": "writing the GGUF", "write_ti_data_to_file": "writing the GGUF",
          "write_tensors_to_file": "writing the GGUF"}
#: numpy's ``tofile`` on a full disk: an OSError without an errno
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")


def _step(err: BaseException) -> str | None:
    """The converter's step ``err`` came from (``reading the tokenizer (set_vocab)``), None when not known."""
    for frame, _ in traceback.walk_tb(err.__traceback__):
        name = frame.f_code.co_name
        step = _STEPS.get(name) or ("reading the tokenizer" if name.startswith("_set_vocab") else None)
        if step is not None:
            return f"{step} ({name})"
    return None


class WriteError(OSError):
    """The converter's failure to write the staged GGUF, with the errno it had (a short write's found by
    `_write_errno`) and the staged file as its filename. `staging_file` restates a full disk or quota
    (ENOSPC, EDQUOT), a file over the size limit (EFBIG) and an unwritable staged file (EACCES, EROFS, EPERM) as its
    one `OutputDirError` line; any other errno, or none, reaches [`convert_to_gguf`][], which raises a
    `GGUFConversionError` naming the output."""


def _write_errno(err: OSError, staged: Path) -> int | None:
    """The errno of a failed write to ``staged``: ``err``'s own, else (numpy's short write says none) the one a
    write of one more block gets now (ENOSPC on a full disk, EDQUOT over a quota)."""
    if err.errno is not None:
        return err.errno
    try:
        with open(staged, "ab") as handle:
            handle.write(bytes(1 << 16))
    except OSError as probe:
        return probe.errno
    return None


def _writing(err: OSError, staged: Path, step: str | None) -> bool:
    """Whether ``err`` is the converter's failure to write the staged GGUF, not to read a file (the export's weights
    are read while the GGUF is written)."""
    if err.filename is not None:
        return Path(os.fsdecode(err.filename)).name == staged.name
    return (err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or (step or "").startswith("writing the GGUF")
            or (err.errno is None and _SHORT_WRITE.match(str(err)) is not None))


class _Errors(logging.Handler):
    """Keeps the messages of the converter's ERROR records (what it logs before ``sys.exit(1)``)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().strip())


@contextlib.contextmanager
def _converter_output(quiet: bool, errors: _Errors) -> Iterator[None]:
    """The converter's logging and warnings: its ERROR records kept in ``errors``; when ``quiet``, nothing of it
    shown. The root logger's handlers and level (``logging.basicConfig`` in its ``main``) come back after it."""
    root = logging.getLogger()
    saved_root = root.level, list(root.handlers)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(logger.propagate, list(logger.handlers)) for logger in loggers]
    for logger in loggers:
        logger.addHandler(errors)
        logger.propagate = logger.propagate and not quiet
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            yield
    finally:
        for logger, (propagate, handlers) in zip(loggers, saved, strict=True):
            logger.propagate, logger.handlers[:] = propagate, handlers
        root.setLevel(saved_root[0])
        root.handlers[:] = saved_root[1]


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block; as it was after it (an inherited method: inherited again)."""
    own = name in vars(owner)
    before = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, before)
        else:
            delattr(owner, name)


def _text_model(converter: ModuleType) -> type:
    """The converter's class that names the pre-tokenizer (in ``conversion.base`` in newer llama.cpp trees, in the
    converter's own module in older ones)."""
    try:
        from conversion.base import TextModel
    except ImportError:
        TextModel = getattr(converter, "TextModel", None)
    if TextModel is None or not hasattr(TextModel, "get_vocab_base_pre"):
        raise GGUFConversionError("this llama.cpp converter has no TextModel.get_vocab_base_pre to name the "
                                  "pre-tokenizer with; use pre_tokenizer='none' or fetch the pinned one with "
                                  f"`{FETCH}`")
    return TextModel


def run_converter(converter: ModuleType, export: Path, staged: Path, outtype: str, pre_tokenizer: str) -> str | None:
    """The converter's ``main`` on ``export``, writing ``staged``; returns the pre-tokenizer named here (None: the
    converter named it). Its failures are a `GGUFConversionError` (an OSError, a full disk, stays one)."""
    named: list[str] = []
    errors, quiet = _Errors(), not verbose()
    with contextlib.ExitStack() as stack:
        if pre_tokenizer != "none":
            TextModel = _text_model(converter)
            recognise = TextModel.get_vocab_base_pre

            def get_vocab_base_pre(self, tokenizer):
                log = logging.getLogger("hf-to-gguf")
                level = log.level
                log.setLevel(logging.ERROR)  # its banner about an unknown fingerprint: the result says it
                try:
                    return recognise(self, tokenizer)
                except NotImplementedError:  # the converter's "not recognized": name it as asked
                    named.append(pre_tokenizer)
                    return pre_tokenizer
                finally:
                    log.setLevel(level)

            stack.enter_context(_patched(TextModel, "get_vocab_base_pre", get_vocab_base_pre))
        writer = getattr(getattr(converter, "gguf", None), "GGUFWriter", None)
        if quiet and writer is not None and hasattr(writer, "write_tensors_to_file"):
            write = writer.write_tensors_to_file

            def write_tensors_to_file(self, *, progress: bool = False) -> None:
                return write(self, progress=False)  # its progress bar

            stack.enter_context(_patched(writer, "write_tensors_to_file", write_tensors_to_file))
        # the converter fills "{ftype}"-style fields of the file name as a template: the staged name holds no brace
        # (check_placement refuses them in the output's name, which the staged name is built from)
        stack.enter_context(_patched(sys, "argv", [CONVERTER, str(export), "--outfile", str(staged), "--outtype",
                                                   outtype]))
        stack.enter_context(_converter_output(quiet, errors))
        if quiet:  # its main's logging.basicConfig(level=INFO) would print every INFO record of the process
            stack.enter_context(_patched(logging, "basicConfig", lambda *args, **kwargs: None))
        try:
            converter.main()
        except SystemExit as err:
            if err.code not in (0, None):
                said = errors.messages[-1] if errors.messages else f"exit status {err.code}"
                raise GGUFConversionError(f"llama.cpp's converter refused {str(export)!r}: {first_line(said)}") \
                    from None
        except Exception as err:  # noqa: BLE001 - the converter's own failure, restated in one line
            step = _step(err)
            if isinstance(err, OSError) and _writing(err, staged, step):
                code = _write_errno(err, staged)
                raise WriteError(code, first_line(err) if code is None else os.strerror(code), str(staged)) \
                    from err
            hint = ""
            if "pre-tokenizer was not recognized" in str(err):
                hint = "; name the tokenizer's pre-tokenizer with --pre-tokenizer NAME (pre_tokenizer=NAME)"
            elif isinstance(err, ModuleNotFoundError) and err.name == "sentencepiece":
                hint = "; install it (pip install -e '.[deploy]', which brings it)"
            elif isinstance(err, ModuleNotFoundError) and err.name:
                hint = f"; install it (pip install {err.name})"
            during = f" while {step}" if step else ""
            raise GGUFConversionError(f"llama.cpp's converter failed on {str(export)!r}{during}: {described(err)}"
                                      f"{hint}") from err
    return named[0] if named else None


def tensor_count(file: Path, export: Path) -> int:
    """The tensor count in a GGUF file's header (magic ``GGUF``, version, tensor count)."""
    with open(file, "rb") as handle:
        head = handle.read(16)
    if len(head) < 16 or head[:4] != b"GGUF":
        raise GGUFConversionError(f"llama.cpp's converter wrote no GGUF for {str(export)!r} ({len(head)} bytes "
                                  f"starting {head[:4]!r})")
    return int.from_bytes(head[8:16], "little")
