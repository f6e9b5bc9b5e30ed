"""The layer checker itself: it must flag an upward include and a same-layer include."""
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def run(root):
    return subprocess.run([sys.executable, str(HERE / "check_layers.py"), str(root)],
                          capture_output=True, text=True)


def test_flags_upward_and_sideways_includes(tmp_path):
    (tmp_path / "messages").mkdir()
    (tmp_path / "messages" / "a.hpp").write_text('#include "config/b.hpp"\n')
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "b.hpp").write_text('#include "search/c.hpp"\n#include "messages/a.hpp"\n')
    result = run(tmp_path)
    assert result.returncode == 1
    assert "messages/a.hpp: includes config/b.hpp" in result.stdout
    assert "config/b.hpp: includes search/c.hpp" in result.stdout
    assert "2 layer violations" in result.stdout


def test_accepts_downward_includes(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "m.cpp").write_text('#include "tpu_nodes/x.hpp"\n#include "maxkernel/schema/eval.capnp.h"\n')
    assert run(tmp_path).returncode == 0
