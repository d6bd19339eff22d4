"""The fabric codemod's parts (codemods/fabric.py)."""
