"""What the client's parts hand each other, defined once below all of them: a batch's
layout (batch.py: data makes it, training reads it), a DisTrO result's blocks (blocks.py)
and its wire bytes (distro_wire.py: training writes them, verification and the runtime
read them). training, data and verification import these modules and not each other
(the contracts in pyproject.toml); nothing here imports them."""
