"""The ``idemlog`` command line: ``broker``, ``log``, ``topics``, ``transactions``."""
