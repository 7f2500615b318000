"""The timeout option: anything but a positive, finite number of seconds is refused at construction."""

import datetime
import math

import pytest

import paraflow
from paraflow.core.options import DEFAULT_TIMEOUT_S

BAD = [0, -5, "abc", math.nan, math.inf, "nan", "inf", "-inf", "0", "-5", datetime.timedelta(0)]
BACKENDS = ["single", "ddp-gloo", "horovod"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_bad_timeout_option_is_refused_at_construction(backend, value):
    with pytest.raises(paraflow.ConfigurationError) as caught:
        paraflow.get_backend(backend, timeout=value)
    assert f"timeout={value!r}" in str(caught.value) and "positive, finite number of seconds" in str(caught.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", ["0", "-5", "abc", "nan", "inf", "-inf", "1e400", " "])
def test_bad_paraflow_timeout_variable_is_refused_at_construction(backend, value, monkeypatch):
    monkeypatch.setenv("PARAFLOW_TIMEOUT", value)
    with pytest.raises(paraflow.ConfigurationError) as caught:
        paraflow.get_backend(backend)
    assert f"PARAFLOW_TIMEOUT={value!r}" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("value, seconds", [(30, 30.0), ("2.5", 2.5), (datetime.timedelta(minutes=2), 120.0)])
def test_good_timeouts_are_taken(value, seconds, monkeypatch):
    def timeout_seconds(value):
        return paraflow.get_backend("single", timeout=value).timeout

    monkeypatch.delenv("PARAFLOW_TIMEOUT", raising=False)
    assert timeout_seconds(value) == seconds
    monkeypatch.setenv("PARAFLOW_TIMEOUT", "7")
    assert timeout_seconds(None) == 7.0 and timeout_seconds(value) == seconds  # the option wins
    monkeypatch.setenv("PARAFLOW_TIMEOUT", "")
    assert timeout_seconds(None) == DEFAULT_TIMEOUT_S


def test_an_empty_paraflow_timeout_leaves_horovods_own_variables_alone(monkeypatch):
    """Only a timeout that was really given overrides HOROVOD_* timeouts set in the shell."""
    from paraflow.backends.horovod.backend import HorovodBackend

    monkeypatch.setenv("PARAFLOW_TIMEOUT", "")
    assert not HorovodBackend("horovod")._timeout_given
    monkeypatch.setenv("PARAFLOW_TIMEOUT", "12")
    assert HorovodBackend("horovod")._timeout_given
