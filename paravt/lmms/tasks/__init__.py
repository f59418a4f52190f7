"""Task folder of the paravt lmms-eval plugin (lmms-eval's CLI requires `PLUGIN.tasks`); paravt
ships no lmms-eval task yet: use lmms-eval's own (videomme, mlvu, ...) or a local YAML task."""
