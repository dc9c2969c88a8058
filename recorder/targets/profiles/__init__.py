"""Gateway profiles: a gateway adopted with a YAML file (`format.py`), the driver that runs one (`driver.py`), and the
profiles tito ships (`*.yaml`)."""
