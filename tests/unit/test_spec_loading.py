"""Reading a spec file: YAML errors, defaults, paths relative to the spec, the shipped example."""

from __future__ import annotations

import shutil

import pytest

from provisioner.base.paths import EXAMPLES_DIR, SPEC_EXAMPLE
from provisioner.spec import SpecError, load_spec, loading
from tests.unit.conftest import host, instance, spec_data, write_spec


def load_problems(path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return [str(problem) for problem in caught.value.problems]


def text_problems(tmp_path, text: str) -> list[str]:
    path = tmp_path / "spec.yml"
    path.write_text(text)
    return load_problems(path)


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    text = "version: 1\nhosts:\n  - name: ws3090\n    address: 192.0.2.10: 22\n"
    assert text_problems(tmp_path, text) == ["spec.yml:4:24: mapping values are not allowed here — fix the YAML syntax"]


def test_tab_indentation_is_a_syntax_error(tmp_path):
    text = "version: 1\nhosts:\n  - name: ws3090\n\taddress: 192.0.2.10\n"
    assert text_problems(tmp_path, text) == [
        "spec.yml:4:1: found character '\\t' that cannot start any token (while scanning for the next token) "
        "— fix the YAML syntax"
    ]


def test_duplicate_yaml_key_is_an_error_not_a_silent_override(tmp_path):
    text = "version: 1\nhosts:\n  - name: ws3090\n    address: 192.0.2.10\n    name: ws4090\n"
    assert text_problems(tmp_path, text) == ["spec.yml:5:5: duplicate key 'name' — remove one of them"]


def test_missing_spec_file(tmp_path):
    assert load_problems(tmp_path / "nope.yml") == [f"{tmp_path}/nope.yml: cannot read the spec: No such file or directory"]


def test_empty_spec_file(tmp_path):
    assert text_problems(tmp_path, "# nothing yet\n") == ["(spec): the spec is empty — start from `provision init`"]


def test_defaults(tmp_path):
    data = spec_data(hosts=[{"name": "ws3090", "address": "192.0.2.10"}],
                     instances=[{"name": "chat", "host": "ws3090", "model": "m", "gpus": ["GPU-00000000-0000-4000-8000-000000000000"]}])
    spec = load_spec(write_spec(tmp_path / "spec.yml", data))
    (h,), (i,) = spec.hosts, spec.instances
    assert (h.ssh.user, h.ssh.port, h.ssh.key, h.ssh.known_hosts, h.ssh.become) == ("root", 22, None, None, False)
    assert (h.settings.swappiness, h.settings.sysctls, h.settings.shm_size, h.settings.nouveau_blacklist) == (1, {}, None, True)
    assert (h.gpus.expected_count, h.gpus.count, h.gpus.persistence_mode, h.gpus.memory_share_limit) == (None, 0, True, 0.95)
    assert (h.vllm.version, h.vllm.install_path) == ("0.25.0", "/opt/vllm")
    assert (i.port, i.bind, i.gpu_memory_utilization, i.options, i.env, i.api_key_file) == (8000, "127.0.0.1", 0.9, {}, {}, None)
    assert spec.source_path == tmp_path / "spec.yml"


def test_paths_are_relative_to_the_spec_file_and_tilde_is_expanded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "conf" / "secrets").mkdir(parents=True)
    (tmp_path / "conf" / "secrets" / "chat.key").write_text("sk-1\n")
    (tmp_path / "conf" / "known_hosts").write_text("192.0.2.20 ssh-ed25519 AAAA\n")
    data = spec_data(
        hosts=[host(ssh={"key": "~/.ssh/id_ed25519", "known_hosts": "./known_hosts"})],
        instances=[instance("chat", 8000, api_key_file="secrets/../secrets/chat.key")],
    )
    monkeypatch.chdir(tmp_path)  # relative to the spec, not to the working directory
    spec = load_spec(write_spec(tmp_path / "conf" / "spec.yml", data))
    assert spec.hosts[0].ssh.key == f"{home}/.ssh/id_ed25519"
    assert spec.hosts[0].ssh.known_hosts == f"{tmp_path}/conf/known_hosts"
    assert spec.instances[0].api_key_file == f"{tmp_path}/conf/secrets/chat.key"


def test_the_shipped_example_is_valid_once_its_files_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("key")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "qwen.key").write_text("sk-example\n")
    spec = load_spec(shutil.copy(SPEC_EXAMPLE, tmp_path / "spec.yml"))
    assert [h.name for h in spec.hosts] == ["ws3090"]
    assert spec.instances[0].options == {"max-model-len": 4096, "block-size": 16, "max-num-seqs": 128}
    assert spec.instances[0].api_key_file == f"{tmp_path}/secrets/qwen.key"


def test_the_shipped_example_reports_its_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    # copied alone, without the key file `provision init` writes beside it (the ssh key: ssh's defaults)
    assert load_problems(shutil.copy(SPEC_EXAMPLE, tmp_path / "spec.yml")) == [
        f"instances[0].api_key_file: {tmp_path}/secrets/qwen.key does not exist — create it with the API key "
        "(its content becomes VLLM_API_KEY) or correct the path",
    ]


SAMPLE_DOCUMENTS = [
    "version: 1\nhosts: []\n",
    "defaults: &d {swappiness: 1}\nhosts:\n  - {<<: *d, name: a}\n  - <<: *d\n    name: b\n    swappiness: 10\n",
    "a: '1'\nb: 1\nc: 1.5\nd: yes\ne: ~\nf: 2026-12-02\ng: 0o17\nh: 017\ni: '0x1F'\nj: 0x1F\n",
    "key: |\n  line one\n  line two\nfolded: >\n  a\n  b\n",
    "\"q\\u00e9\": \"tab\\there\"\nlist: [a, 'b c', \"d\\\"e\"]\n",
]


@pytest.mark.parametrize("text", [*SAMPLE_DOCUMENTS, *(path.read_text() for path in sorted(EXAMPLES_DIR.glob("*.yml"))),
                                  SPEC_EXAMPLE.read_text()])
def test_libyaml_and_pyyaml_read_a_spec_to_the_same_data(text):
    """Specs are read by libyaml where it is there (a fleet's spec reads several times faster), PyYAML's own
    parser giving the messages of a document with a problem: both must build exactly the same data."""
    fast = loading._fast_load(text)
    assert fast is not loading._UNREAD
    strict = loading._StrictLoader(text)
    try:
        slow = strict.get_single_data()
    finally:
        strict.dispose()
    assert repr(fast) == repr(slow)  # repr: the same values of the same types (1 is not True, 1.0 not 1)


@pytest.mark.parametrize("text", ["a: 1\na: 2\n", "a: [1, 2\n", "a:\n\t- b\n", "x: &a [*a]\n"])
def test_a_document_libyaml_finds_a_problem_in_is_left_to_pyyaml_for_its_message(text):
    assert loading._fast_load(text) is loading._UNREAD
