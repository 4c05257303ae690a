"""NodeAgent is the node's health (the Slurm sync writes it too): renamed NodeHealth, its table kept."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0017_rankrun_stop_requested"),
    ]

    operations = [
        migrations.AlterModelTable(name="nodeagent", table="scheduling_nodeagent"),
        migrations.RenameModel(old_name="NodeAgent", new_name="NodeHealth"),
    ]
