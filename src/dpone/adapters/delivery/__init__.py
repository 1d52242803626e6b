"""Resumable delivery adapters: the REST sink (httpx) and the control-plane stores."""
