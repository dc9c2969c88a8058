"""How tito's processes start and run: server settings, aiohttp's TLS deferred, third-party import noise kept
quiet, and token lists the garbage collector never walks."""
