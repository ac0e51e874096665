"""psyche_common.tcp.handshake: the Challenge frame spliced around its nonce is the frame
pydantic makes of the same Challenge, and the client decodes it back to the nonce."""

from __future__ import annotations

import os

from psyche_common.tcp.framing import encode_frame
from psyche_common.tcp.handshake import challenge_frame
from psyche_common.tcp.messages import Challenge, encode


def test_the_spliced_challenge_frame_is_the_encoded_challenge() -> None:
    for nonce in (bytes(32), b"\xff" * 32, os.urandom(32)):
        frame = challenge_frame(nonce)
        assert frame == encode_frame(encode(Challenge(nonce=nonce)))
        assert Challenge.model_validate_json(frame[4:]).nonce == nonce
