"""What arrives and how it is answered: event sources, compatible APIs, media types, warm pings."""
