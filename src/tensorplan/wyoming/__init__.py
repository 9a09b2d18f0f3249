"""`tensorplan wyoming`: speech to text over the Wyoming protocol, for Home Assistant's voice
pipeline (docs/wyoming.md). Needs the `wyoming` package: pip install 'tensorplan[wyoming]'.

info.py answers `describe`; handler.py runs one connection (transcribe, audio-start,
audio-chunk*, audio-stop → transcript-start, transcript-chunk*, transcript-stop,
transcript); server.py binds the URI and shares one model among every connection.
"""
