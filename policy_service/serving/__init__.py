"""Serving a checkpoint's policy over HTTP (JSON) on Ray Serve: `policy-service serve`.

http_api: the wire format (requests checked into arrays, errors, tokens, the spec);
deployment: the Serve deployment hosting one PolicyHost per replica;
server: the process that starts Ray and Serve and runs until SIGTERM/SIGINT.
"""
