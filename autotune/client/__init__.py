"""How autotune talks to a server: the HTTP client (http.py) and the streamed answer's protocol
(stream.py). Used by gate/ and bench/.
"""
