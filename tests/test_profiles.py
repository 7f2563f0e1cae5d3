import pytest

from helpers import profiles


def test_env_var_and_default(monkeypatch):
    monkeypatch.setenv("FTG_PROFILE", "full")
    assert profiles.active().name == "full"
    monkeypatch.setenv("FTG_PROFILE", "SMOKE")
    assert profiles.active().is_smoke
    monkeypatch.delenv("FTG_PROFILE")
    assert profiles.active().name in profiles.PROFILES


def test_unknown_profile_lists_valid_ones():
    with pytest.raises(
        ValueError,
        match="profile \\(or \\$FTG_PROFILE\\) must be one of 'smoke', 'gpu', 'full', 'auto', got",
    ):
        profiles.active("fast")
    with pytest.raises(TypeError, match="profile must be a string"):
        profiles.active(3)


def test_pick_and_describe(capsys):
    p = profiles.active("smoke")
    assert p.pick(smoke=2, full=100, what="epochs") == 2
    assert profiles.active("full").pick(smoke=2, full=100, what="epochs") == 100
    text = p.describe()
    assert "epochs: 2 (full profile: 100)" in text
    assert "epochs" in capsys.readouterr().out
