"""SyncPulse: when the agents' sync endpoint last answered any node and since when without a break."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0020_exit_cause_requeues'),
    ]

    operations = [
        migrations.CreateModel(
            name='SyncPulse',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('answered_at', models.DateTimeField()),
                ('back_at', models.DateTimeField()),
            ],
        ),
    ]
