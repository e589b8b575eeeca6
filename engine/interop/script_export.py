"""placeholder"""
def export_script(*a, **k): raise NotImplementedError
