"""SGLang's native `/generate` API as the fake engine answers it: requests checked in the real server's order
with its statuses and wording, response bodies with its keys per version profile."""
