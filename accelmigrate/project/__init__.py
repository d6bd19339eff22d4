"""The project around a script: the first-party modules it reaches (`modules.py`), the training loops it hands its
model and loaders to in another module (`training_loops.py`), and where its training runs when the script holds no
training step itself (`training_elsewhere.py`). Read with `ast`, once per run; the codemods ask the facts it leaves
(`codemods/script/project_facts.py`)."""
