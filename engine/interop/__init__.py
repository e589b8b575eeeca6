"""Interop: ONNX export/import, readable PyTorch script export, import of nn.Modules.

The functions the CLI (app/cli/interop_cmds.py) and the GUI call:

    export_onnx(project, path)            -> Path     diagram (+ its weights) -> .onnx
    export_script(project, path, plan)    -> Path     standalone training script
    import_onnx(path)                     -> Imported diagram + weights from an .onnx file
    import_module("pkg.mod:Class", ...)   -> Imported diagram + weights via torch.fx
    save_imported(imported, project_path) -> Path     weights file + project, atomically

An Imported holds the Project and its state_dict until it is saved; nothing is
written before save_imported, so a failed import leaves no file behind.
"""
from engine.interop.common import Imported, InteropError, save_imported
from engine.interop.module.importer import import_module
from engine.interop.onnx.export import export_onnx
from engine.interop.onnx.reader import import_onnx
from engine.interop.script_export import export_script

__all__ = ["Imported", "InteropError", "save_imported", "import_module", "export_onnx", "import_onnx", "export_script"]
