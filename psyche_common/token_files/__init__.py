"""Token files (`.ds`, `.bin`, `.npy`: raw little-endian u16/u32 tokens, no header) as
fixed-length samples: read by the client's local and HTTP providers and by the TCP data
server.

    LocalDataProvider(path, max_seq_len, token_size, shuffle)   a directory of token files
    build_sequence_index, check_batch, tokens_to_tensor         the sample index rules
    shuffle_in_place, ChaChaRng                                 the Seeded shuffle (reference)
    permutation.shuffle_permutation                             the same order, as an array
    DataProviderError                                           what goes wrong, named
"""

from psyche_common.token_files.chacha import ChaChaRng, shuffle_in_place
from psyche_common.token_files.local import LocalDataProvider
from psyche_common.token_files.sequences import DataProviderError

__all__ = ["ChaChaRng", "DataProviderError", "LocalDataProvider", "shuffle_in_place"]
