"""Run the site playbook against a spec's hosts and report per task and per host (importable, no CLI)."""
