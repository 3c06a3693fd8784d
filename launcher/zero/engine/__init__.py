"""The engine: ``initialize`` assembles it; the engine runs forward, backward and the step."""
