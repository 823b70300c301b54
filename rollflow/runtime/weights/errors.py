"""Errors of the weight store and its transfer.

They subclass UserError because each names something an operator fixes (a version that was
never published, a codec spelled wrong, a server that is down or serves corrupt data), so the
CLI reports them in one line.
"""

from rollflow.errors import UserError


class WeightsError(UserError):
    """Base of every weight-store and weight-transfer error."""


class CodecError(WeightsError):
    """A codec name that cannot be parsed or a combination that cannot work."""


class UnknownVersionError(WeightsError):
    """The store holds no such version (never published, or pruned)."""


class WeightTransferError(WeightsError):
    """A pull gave up after its retries; nothing was loaded."""


class WeightIntegrityError(WeightTransferError):
    """Data failed a checksum; the puller never returns weights that fail one."""
