"""What migrated scripts import: small, torch-only helpers.

Each submodule covers one concern (`env`: where this process sits in a
launch; `device`: which device it computes on; ...). Nothing here imports
anything but torch and the standard library.
"""
