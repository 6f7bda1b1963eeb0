"""The Hugging Face Hub's side of a fetch: what the cache already holds of a repo (asked
offline), the revision the Hub serves with its files' sizes, and the Hub's refusals in one
line (never the token itself). huggingface_hub reads HF_HOME, HF_ENDPOINT and HF_TOKEN from
the environment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class FetchError(RuntimeError):
    """A checkpoint could not be put into the cache (or checked); the message is one line."""


class Unreachable(FetchError):
    """The Hub could not be asked (no network, a proxy, an outage)."""


def cached_snapshot(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def hub_refusal(error: Exception) -> str:
    """The Hub's refusal in one line, with what to do about it (never the token itself)."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    status = getattr(getattr(error, "response", None), "status_code", "?")
    token = has_token()
    if isinstance(error, GatedRepoError):
        if token:
            return (
                f"the repo is gated and the token in HF_TOKEN has no access (HTTP {status}): "
                "accept its terms on the Hub with that token's account"
            )
        return (
            f"the repo is gated and HF_TOKEN is empty (HTTP {status}): accept its terms on "
            "the Hub, then set HF_TOKEN to a token of that account"
        )
    if isinstance(error, RepositoryNotFoundError):
        if token:
            return (
                f"the Hub has no such repo, or the token in HF_TOKEN cannot read it (HTTP "
                f"{status}): check the name, and the token's access to it"
            )
        return (
            f"the Hub has no such repo, or it is private or gated and HF_TOKEN is empty (HTTP "
            f"{status}): check the name, or set HF_TOKEN to a token that can read it"
        )
    if status == 401:
        return "the Hub refused the token in HF_TOKEN (HTTP 401): set a valid one"
    if status == 429:
        return "the Hub is rate limiting this address (HTTP 429): wait a while and start again"
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    return f"the Hub answered HTTP {status} ({first})"


@dataclass(frozen=True)
class Revision:
    sha: str
    sizes: dict[str, int]  # each file of the revision and its size in bytes


def revision_of(repo_id: str) -> Revision:
    """The commit the Hub serves for `main` and its files with their sizes."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        # snapshot_download's default revision is main, so this asks for that branch too.
        sha = str(api.model_info(repo_id, revision="main").sha)
        tree = api.list_repo_tree(repo_id, revision=sha, recursive=True)
        sizes = {entry.path: int(entry.size) for entry in tree if hasattr(entry, "size")}
    except HfHubHTTPError as error:
        raise FetchError(hub_refusal(error)) from error
    except Exception as error:  # the transport's error types change between releases
        raise Unreachable(f"the Hub is unreachable ({type(error).__name__})") from error
    return Revision(sha, sizes)
