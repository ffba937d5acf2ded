"""The settings a command acts on: profiles, groups, inventories and services, read from YAML with
the file and line of every value (see docs/architecture.md for which module owns what).

    source.py     YAML -> plain data with origins (`Sourced`); --set
    layers.py     layering: merge, --set applied, what differs in a group
    model.py      the Profile and its sections (pydantic)
    rules.py      the rules that span fields
    validate.py   Sourced -> Profile, every problem with its file and line
    paths.py      where profiles and units are found
    hostnames.py  host ranges (expand, compress)
    ansible.py    Ansible inventories (YAML, INI)
    targets.py    groups and which hosts a name means
    inventory.py  the Inventory: a host's layers -> its Profile; services

`ddtree_ops.profile` is the public face the rest of the tool imports.
"""
