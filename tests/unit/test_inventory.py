"""Groups and inventories: layering defaults -> group -> host, Ansible YAML and INI inventories, and
every problem reported with its file and line."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from ddtree_ops.errors import ProfileError, UsageError
from ddtree_ops.config.ansible import parse_ini, parse_yaml_inventory
from ddtree_ops.config.hostnames import expand
from ddtree_ops.config.inventory import Inventory
from ddtree_ops.config.layers import differences
from ddtree_ops.profile import load_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", d)
    return d


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_forty_identical_hosts_need_one_group_file_and_one_line_each(profiles: Path) -> None:
    group = profiles / "groups" / "a6000.yaml"
    text = group.read_text().replace("gpu:\n", "hosts:\n  - gpu-a[01:40]\n  - gpu-a41: {memory: {mem_fraction_static: 0.78}}\n\ngpu:\n", 1)
    group.write_text(text)
    inv = Inventory.load(profiles)
    members = inv.members("a6000")
    assert members[:2] == ["gpu-a01", "gpu-a02"] and members[-2:] == ["gpu-a40", "gpu-a41"] and len(members) == 41
    a07 = inv.profile("gpu-a07")
    ct129 = load_profile("ct129", directory=profiles)
    # the group carries everything ct129's own file says: the two resolve alike but for their names
    assert a07.host.ssh_host == "gpu-a07" and a07.name == "gpu-a07"
    assert a07.model_dump(exclude={"name", "host"}) == ct129.model_dump(exclude={"name", "host"})
    assert inv.profile("gpu-a41").memory.mem_fraction_static == 0.78
    # a profile file of its own still comes last
    write(profiles / "gpu-a07.yaml", "memory:\n  context_length: 16384\n")
    assert Inventory.load(profiles).profile("gpu-a07").memory.context_length == 16384


def test_a_bad_value_in_a_group_file_names_the_group_file_line(profiles: Path) -> None:
    group = profiles / "groups" / "pro6000.yaml"
    group.write_text(group.read_text().replace("gpu:\n", "hosts: [b01]\n\ngpu:\n", 1)
                     .replace("mem_fraction_static: 0.84", "mem_fraction_static: 1.84"))
    with pytest.raises(ProfileError) as exc:
        Inventory.load(profiles).profile("b01")
    line = line_of(group, "mem_fraction_static: 1.84")
    assert exc.value.problems == [f"{group}:{line} memory.mem_fraction_static: 1.84 is not in (0, 1)"]


def test_group_file_typo_is_refused_with_line(profiles: Path) -> None:
    group = write(profiles / "groups" / "odd.yaml", """
        hosts: [x1]
        memroy:
          context_length: 4096
        """)
    with pytest.raises(ProfileError) as exc:
        Inventory.load(profiles)
    assert exc.value.problems == [f"{group}:2 memroy: unknown key (did you mean 'memory'?) "
                                  "(a group file has hosts, children and profile keys)"]


INI = """
    # the fleet's Ansible inventory
    ct129 ansible_user=ops

    [a6000]
    ct13[0:2] ansible_port=2222
    gpu-x ansible_host=10.1.2.3 ansible_become=true
    box ansible_connection=local

    [pro6000]
    ct200
    ct20[1:2]

    [lab:children]
    a6000
    pro6000

    [pro6000:vars]
    ansible_user=deploy
    unrelated_var=kept for ansible
    """

YAML = """
    all:
      hosts:
        ct129:
          ansible_user: ops
      children:
        lab:
          children:
            a6000:
              hosts:
                ct13[0:2]:
                  ansible_port: 2222
                gpu-x:
                  ansible_host: 10.1.2.3
                  ansible_become: true
                box:
                  ansible_connection: local
            pro6000:
              hosts:
                ct200:
                ct20[1:2]:
              vars:
                ansible_user: deploy
                unrelated_var: kept for ansible
    """


@pytest.mark.parametrize("name,text", [("hosts.ini", INI), ("hosts.yml", YAML)])
def test_ansible_inventory_gives_hosts_groups_and_connection_vars(profiles: Path, tmp_path: Path, name: str,
                                                                 text: str) -> None:
    path = write(tmp_path / name, text)
    inv = Inventory.load(profiles, path)
    assert inv.members("lab") == ["ct130", "ct131", "ct132", "gpu-x", "box", "ct200", "ct201", "ct202"]
    assert inv.profile("box").host.transport == "local" and inv.profile("ct130").host.transport == "ssh"
    assert inv.resolve(["pro6000"]) == ["ct200", "ct201", "ct202"]
    p = inv.profile("ct131")
    assert (p.host.ssh_host, p.host.port, p.gpu.arch) == ("ct131", 2222, "sm_86")
    x = inv.profile("gpu-x")
    assert (x.host.ssh_host, x.host.sudo) == ("10.1.2.3", True)
    assert inv.profile("ct202").host.user == "deploy"  # a group var
    assert inv.profile("ct129").host.user == "ops"  # an ungrouped host with vars; its file does the rest
    # ct200 has a profile file and is in pro6000: group then file; the file says the same, so no change
    assert inv.profile("ct200").model_dump(exclude={"host"}) == \
        load_profile("ct200", directory=profiles).model_dump(exclude={"host"})


def test_yaml_inventory_typo_is_refused_with_file_line_and_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts.yml", """
        all:
          children:
            a6000:
              hostz:
                ct130:
        """)
    with pytest.raises(ProfileError) as exc:
        parse_yaml_inventory(path.read_text(), str(path))
    assert exc.value.problems == [f"{path}:4 all.children.a6000.hostz: unknown key (did you mean 'hosts'?) "
                                  "(an Ansible group has hosts, children and vars)"]


def test_yaml_inventory_hosts_as_a_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"inv.yml:2 all.hosts: expected a mapping"):
        parse_yaml_inventory("all:\n  hosts:\n    - ct129\n", "inv.yml")


def test_ini_inventory_typos_are_refused_with_line(tmp_path: Path) -> None:
    text = "[a6000]\nct130\n\n[lab:chidren]\na6000\n\n[pro6000]\nct20[1-2]\nct200 ansible_port\n"
    with pytest.raises(ProfileError) as exc:
        parse_ini(text, "hosts.ini")
    assert exc.value.problems == [
        "hosts.ini:4 [lab:chidren]: unknown section type (did you mean 'children'?) (a section is [group], "
        "[group:vars] or [group:children])",
        "hosts.ini:8 host range 'ct20[1-2]': expected [start:end] or [start:end:step], e.g. a6k-[01:40]",
        "hosts.ini:9 ct200: expected key=value after the host name, got 'ansible_port'",
    ]


def test_a_child_group_that_is_a_typo_is_refused(profiles: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "hosts.ini", "[pro6000]\nct201\n\n[lab:children]\npro600\n")
    with pytest.raises(ProfileError, match=r"hosts.ini:4 group 'lab' has child 'pro600', which has no hosts and "
                                           r"no group file \(did you mean 'pro6000'\?\)"):
        Inventory.load(profiles, path)


def test_a_missing_inventory_file_is_a_usage_error(profiles: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inventory .*nope.ini does not exist"):
        Inventory.load(profiles, tmp_path / "nope.ini")


def test_two_groups_at_one_depth_that_disagree_are_refused(profiles: Path, tmp_path: Path) -> None:
    write(profiles / "groups" / "fast.yaml", "gate:\n  stay_healthy_s: 5\n")
    write(profiles / "groups" / "slow.yaml", "gate:\n  stay_healthy_s: 60\n")
    inv_path = write(tmp_path / "hosts.ini", "[a6000]\nct130\n[fast]\nct130\n[slow]\nct130\n")
    with pytest.raises(ProfileError) as exc:
        Inventory.load(profiles, inv_path).profile("ct130")
    (msg,) = exc.value.problems
    assert "slow.yaml:2 gate.stay_healthy_s: ct130 is in groups 'fast' (" in msg
    assert "fast.yaml:2: 5) and 'slow' (60) at the same depth" in msg
    # made a child of the other, the more specific group wins, as Ansible's children do
    nested = write(tmp_path / "nested.ini", "[a6000]\nct130\n[fast]\nct130\n[slow]\nct130\n[fast:children]\nslow\n")
    assert Inventory.load(profiles, nested).profile("ct130").gate.stay_healthy_s == 60


def test_resolve_names_groups_globs_ranges_and_exclusions(profiles: Path, tmp_path: Path) -> None:
    inv = Inventory.load(profiles, write(tmp_path / "h.ini", INI))
    assert inv.resolve(["ct13*", "ct200"]) == ["ct130", "ct131", "ct132", "ct200"]
    assert inv.resolve(["lab", "!a6000"]) == ["ct200", "ct201", "ct202"]
    assert inv.resolve(["ct20[1:2]", "ct201"]) == ["ct201", "ct202"]
    assert inv.resolve(["all"])[:2] == ["ct129", "ct200"] and len(inv.resolve(["all"])) == 9
    with pytest.raises(UsageError, match=r"unknown host or group 'pro600' \(did you mean 'pro6000'\?\)"):
        inv.resolve(["pro600"])


def test_a_host_without_any_settings_says_where_it_is_listed(profiles: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "h.ini", "[empty]\nlonely\n")
    with pytest.raises(ProfileError) as exc:
        Inventory.load(profiles, path).profile("lonely")
    assert exc.value.problems[0].startswith(f"{path}:2 lonely: no settings: it is in no group with a group file "
                                            "(empty)")


def test_unknown_host_suggests_the_closest(profiles: Path) -> None:
    with pytest.raises(ProfileError, match=r"no profile for host 'ct12' \(did you mean 'ct129'\?\)"):
        load_profile("ct12", directory=profiles)


def test_expand_keeps_zero_padding_and_steps() -> None:
    assert expand("gpu-[08:11]") == ["gpu-08", "gpu-09", "gpu-10", "gpu-11"]
    assert expand("n[0:6:3]x") == ["n0x", "n3x", "n6x"]
    assert expand("r[a:c][1:2]") == ["ra1", "ra2", "rb1", "rb2", "rc1", "rc2"]
    with pytest.raises(ProfileError, match="is empty"):
        expand("n[5:1]")


def test_differences_name_only_what_differs() -> None:
    docs = {h: {"name": h, "host": {"ssh_host": h}, "gpu": {"arch": "sm_86"},
                "memory": {"mem_fraction_static": 0.81}} for h in ("a", "b", "c")}
    docs["c"]["memory"]["mem_fraction_static"] = 0.78
    shared, differ = differences(docs)
    assert shared == {"gpu.arch": "sm_86"}
    assert differ == {"a": {"memory.mem_fraction_static": 0.81}, "b": {"memory.mem_fraction_static": 0.81},
                      "c": {"memory.mem_fraction_static": 0.78}}
