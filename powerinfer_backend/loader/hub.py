"""GGUF files from the Hugging Face Hub for ``Llama.from_pretrained`` (llama-cpp-python's
rules: ``filename`` and each of ``additional_files`` is a glob that must match exactly one
file of the repository; the first shard of a split GGUF loads the others)."""

from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path
from typing import List, Optional


def _one_match(pattern: str, repo_id: str, rel: List[str], full: List[str]) -> str:
    hits = [f for f in rel if fnmatch.fnmatch(f, pattern)]
    if not hits:
        raise ValueError(f"No file found in {repo_id} that match {pattern}\n\nAvailable Files:\n{json.dumps(rel)}")
    if len(hits) > 1:
        raise ValueError(
            f"Multiple files found in {repo_id} matching {pattern}\n\nAvailable Files:\n{json.dumps(full)}"
        )
    return hits[0]


def from_pretrained(
    repo_id: str,
    filename: str,
    *,
    additional_files: Optional[List[str]] = None,
    local_dir=None,
    local_dir_use_symlinks="auto",
    cache_dir=None,
) -> str:
    """Download the file of ``repo_id`` matching ``filename`` (and ``additional_files``);
    returns the local path of the model file.

    Raises:
        ImportError: huggingface-hub is not installed.
        ValueError: a pattern matching no file or several; an invalid repository id.
        huggingface_hub's errors: the Hub cannot be reached, the repository does not exist.
    """
    try:
        from huggingface_hub import HfFileSystem, hf_hub_download
        from huggingface_hub.utils import validate_repo_id
    except ImportError:
        raise ImportError(
            "Llama.from_pretrained requires the huggingface-hub package. "
            "You can install it with `pip install huggingface-hub`."
        ) from None
    validate_repo_id(repo_id)
    full = [f["name"] if isinstance(f, dict) else f for f in HfFileSystem().ls(repo_id, recursive=True)]
    rel = [str(Path(f).relative_to(repo_id)) for f in full]

    def download(rel_path: str, **extra) -> str:
        return hf_hub_download(
            repo_id=repo_id,
            filename=Path(rel_path).name,
            subfolder=str(Path(rel_path).parent),
            local_dir=local_dir,
            local_dir_use_symlinks=local_dir_use_symlinks,
            cache_dir=cache_dir,
            **extra,
        )

    model = _one_match(filename, repo_id, rel, full)
    download(model)
    for pattern in additional_files or ():
        download(_one_match(pattern, repo_id, rel, full))
    if local_dir is None:
        return download(model, local_files_only=True)
    return os.path.join(local_dir, Path(model).name)
