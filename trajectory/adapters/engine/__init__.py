"""The engine leg of the adapter: the SGLang `/generate` client, the transport its bytes travel through, and
the JSON codec on that leg."""
