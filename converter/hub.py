"""Publishing a written folder to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

from lpes.errors import LpesError
from lpes.outputs import MARKER


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
