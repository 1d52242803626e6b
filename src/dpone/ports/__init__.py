"""Ports: typing.Protocol interfaces the runtime depends on; adapters implement them."""
