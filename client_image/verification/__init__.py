"""Checking other clients' DisTrO results (issue 18): similarity metrics, the cheap checks
any client can make on any result, and replay verification (a verifier re-trains a
trainer's assigned batches and compares what an honest trainer would have published)."""

from client_image.verification.checks import CheapCheck, cheap_checks
from client_image.verification.replay import ReplayVerifier, Thresholds, Verdict
from client_image.verification.similarity import Similarity, similarity

__all__ = ["CheapCheck", "ReplayVerifier", "Similarity", "Thresholds", "Verdict",
           "cheap_checks", "similarity"]
