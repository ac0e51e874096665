"""Is a commit on the main branch of a Hub repository? Asked of the Hub through
huggingface_hub, blocking (call it from a thread). Shared by the TCP coordinator, which
refuses a checkpoint report naming a commit off main (coordinator_tcp/checkpoint_history.py),
and the client, which refuses to load one (client_image/runtime/model_loading.py): on
Solana the program cannot ask the Hub, so the client is where the rule holds there.

    answer = ask_main_history("org/model", commit)    # HF_ENDPOINT, or endpoint=...
    answer.problem      # None: on main; else why not, in one line
    answer.reached      # False: the Hub did not answer (problem says so)
    answer.main         # main's commit ids seen (remember them: main only grows)

The first question is main's head (`model_info` at "main", one request, no retries, under
`timeout_s`): an unreachable Hub is known at once, and the newest upload, the usual
report, needs nothing more. Only another commit lists main's history
(`list_repo_commits`), then asks whether the repository has the commit at all.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MainHistoryAnswer", "ask_main_history", "one_line"]


@dataclass(frozen=True)
class MainHistoryAnswer:
    problem: str | None
    reached: bool = True
    main: frozenset[str] = frozenset()


def one_line(error: BaseException) -> str:
    """`error` as `Type: first line` (huggingface_hub's messages run over several lines)."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def ask_main_history(repo_id: str, commit: str, *, endpoint: str | None = None,
                     timeout_s: float = 10.0) -> MainHistoryAnswer:
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(endpoint=endpoint)
    where = f"Hub repository {repo_id!r} at {endpoint or constants.ENDPOINT}"
    try:
        head = api.model_info(repo_id, revision="main", timeout=timeout_s).sha
    except RepositoryNotFoundError:
        return MainHistoryAnswer(f"{where} was not found (or is private): cannot tie "
                                 f"commit {commit} to it")
    except RevisionNotFoundError:
        return MainHistoryAnswer(f"{where} has no main branch: commit {commit} is on no main "
                                 "history")
    except Exception as exc:  # huggingface_hub raises many types for a failing Hub
        return MainHistoryAnswer(f"cannot check commit {commit} against the main branch of "
                                 f"{where}: the Hub did not answer ({one_line(exc)})",
                                 reached=False)
    if head == commit:
        return MainHistoryAnswer(None, main=frozenset({commit}))
    try:
        main = frozenset(c.commit_id for c in api.list_repo_commits(repo_id, revision="main"))
    except Exception as exc:  # it answered a moment ago: say what failed
        return MainHistoryAnswer(f"cannot check commit {commit} against the main branch of "
                                 f"{where}: listing it failed ({one_line(exc)})",
                                 reached=False)
    if commit in main:
        return MainHistoryAnswer(None, main=main)
    try:
        api.model_info(repo_id, revision=commit, timeout=timeout_s)
    except RevisionNotFoundError:
        return MainHistoryAnswer(f"{where} has no commit {commit}", main=main)
    except Exception as exc:  # the listing worked: say what is known
        return MainHistoryAnswer(f"commit {commit} is not on the main branch of {where} (and "
                                 f"asking for it failed: {one_line(exc)})", main=main)
    return MainHistoryAnswer(f"commit {commit} of {where} is not on its main branch: it is "
                             "reachable only from another ref (a branch, or a pull request's "
                             "refs/pr/N, which anyone may open), not from the run's history",
                             main=main)
