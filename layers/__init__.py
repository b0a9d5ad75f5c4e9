"""Lambda layer builds for the zip + SnapStart path: dependency layer, model layer, function code."""
