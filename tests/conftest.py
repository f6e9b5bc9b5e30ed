"""Shared by every pytest suite: the programs under test keep their evaluation store in a
private state directory, never the user's, so that no test is answered from an earlier run's
results."""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_state_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("state")
    old = os.environ.get("MAXKERNEL_STATE_DIR")
    os.environ["MAXKERNEL_STATE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MAXKERNEL_STATE_DIR", None)
    else:
        os.environ["MAXKERNEL_STATE_DIR"] = old
