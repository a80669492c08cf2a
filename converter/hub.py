"""Publishing a written folder to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

from lpes.foundation.errors import LpesError
from lpes.foundation.outputs import MARKER


def check_push_target(repo_id: str, api=None) -> None:
    """Plan time for --push-to-hub: a valid repo id, a token, the Hub reachable with it; else LpesError."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise LpesError(f"--push-to-hub {repo_id[:80]!r} is not a Hub repo id (NAME or OWNER/NAME: letters, digits, "
                        f"'-', '_', '.'; {str(err).splitlines()[0][:80]})") from None
    if constants.HF_HUB_OFFLINE:
        raise LpesError("--push-to-hub needs the network, but HF_HUB_OFFLINE is set")
    if api is None and not get_token():
        raise LpesError("--push-to-hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN")
    from huggingface_hub import HfApi

    try:
        (api or HfApi()).whoami()
    except Exception as err:  # noqa: BLE001 - no network, a bad token: httpx, requests and Hub errors alike
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LpesError(f"--push-to-hub: cannot reach the Hub with this token ({first[:120]})") from None


def push_folder(folder: Path, repo_id: str, private: bool = False, api=None) -> str:
    """Create `repo_id` if needed and upload `folder`; returns the commit URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = api or HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            repo_type="model",
            commit_message="Upload LPES pre-scaled checkpoint (lpes-convert)",
            ignore_patterns=[MARKER],  # local bookkeeping of lpes-convert --force, not part of the model
        )
    except (HfHubHTTPError, OSError) as err:
        raise LpesError(f"upload to {repo_id} failed: {str(err).splitlines()[0]}") from None
    return str(getattr(commit, "commit_url", commit))
