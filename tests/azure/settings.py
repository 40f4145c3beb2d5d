"""Azurite's well-known development account (public: it is in Microsoft's docs)."""

from __future__ import annotations

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"QueueEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )
