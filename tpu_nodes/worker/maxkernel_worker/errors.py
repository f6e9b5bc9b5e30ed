"""The one exception type that crosses module boundaries inside the worker."""


class WorkerError(Exception):
    """A classified failure.

    error_class is the name of an ErrorClass enumerant from messages/schema/common.capnp
    (e.g. "badInput", "tooLarge", "loadError", "lowerBlockShape", "traceError");
    message is the human-readable explanation that goes into the reply verbatim.
    """

    def __init__(self, error_class: str, message: str):
        super().__init__(f"{error_class}: {message}")
        self.error_class = error_class
        self.message = message
