"""The broker process: its configuration, the Flight server and request handlers, the
roles (controller, transaction coordinator), background tasks and metrics. Composes the
layers below it."""
