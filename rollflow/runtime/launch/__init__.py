"""Start the manager, engines and trainer described by a config's `launch:` section, and scale engines."""
