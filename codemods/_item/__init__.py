"""The parts of the `item` codemod (codemods/item.py): its analysis and vocabulary."""
