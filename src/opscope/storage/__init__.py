"""opscope.storage: the versioned dump format (writer, lazy reader) and readers of peer dumps."""

from opscope.storage import peers as _peers  # noqa: F401  (registers the peer-dump opener with reader.load)
